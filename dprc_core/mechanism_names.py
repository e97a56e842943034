"""The noise mechanisms' names: one spelling in the engine, the runner, the ledger, the
accountant CLI and endpoint, the API and the docs. Imports nothing (the accountant and the
noise samplers both read it, and the ``dprc accountant`` command's options,
:mod:`dprc_core.accounting.cli_args`, without torch or numpy).

The few other names every layer spells the same way live here too, for the same reason: the
accountant's envelope families (:data:`ENVELOPES`, read by :mod:`dprc_core.norm_methods`), the
randomized-norm sketches (:data:`SKETCHES`, read by :mod:`dprc_core.accounting.events`) and
the default projection dimension :data:`DEFAULT_K` (:mod:`dprc_core.clipping`'s).
"""

from __future__ import annotations

GAUSSIAN = "gaussian"  # independent Gaussian noise, Poisson sampling: DP-SGD / DP-SGD-RC
NU_DPFTRL = "nu_dpftrl"  # ν-DP-FTRL correlated noise, fixed-order batches
NOISE_MECHANISMS = (GAUSSIAN, NU_DPFTRL)
# Spellings of earlier versions (ledger events, the accountant CLI and endpoint): still read
# and accepted, always written back as the one name.
LEGACY_NAMES = {"dp-sgd": GAUSSIAN, "nu-dp-ftrl": NU_DPFTRL, "nu-dpftrl": NU_DPFTRL}

# The accountant's envelope families, weakest first: a plan that mixes norm methods is
# accounted with the strongest family among them (docs/design.md §4); each norm method's family
# is in dprc_core.norm_methods.
ENVELOPES = ("exact", "hutch", "hutchpp")
# How the randomized-norm sketch was drawn (docs/accounting.md §10): "shared" — one
# projection per layer per step for the whole batch, accounted with the revealed-scale model
# (the adversary is given the scale a); "per_example" — an independent projection per example,
# per layer, per step, accounted with the hidden-scale model. "shared" is the default and what
# ledgers without the field mean.
SHARED_SKETCH = "shared"
PER_EXAMPLE_SKETCH = "per_example"
SKETCHES = (SHARED_SKETCH, PER_EXAMPLE_SKETCH)
# The projection dimension k of randomized norms (hutch, hutchpp) where none is given.
DEFAULT_K = 32


def canonical_mechanism(name: object) -> str:
    """The one name (``gaussian`` | ``nu_dpftrl``) of a mechanism given by any spelling."""
    if isinstance(name, str):
        name = LEGACY_NAMES.get(name, name)
        if name in NOISE_MECHANISMS:
            return str(name)
    spellings = (*NOISE_MECHANISMS, *LEGACY_NAMES)
    raise ValueError(f"unknown mechanism {name!r}; expected one of {spellings}")
