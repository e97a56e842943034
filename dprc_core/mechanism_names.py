"""The noise mechanisms' names: one spelling in the engine, the runner, the ledger, the
accountant CLI and endpoint, the API and the docs. Imports nothing (the accountant and the
noise samplers both read it).
"""

from __future__ import annotations

GAUSSIAN = "gaussian"  # independent Gaussian noise, Poisson sampling: DP-SGD / DP-SGD-RC
NU_DPFTRL = "nu_dpftrl"  # ν-DP-FTRL correlated noise, fixed-order batches
NOISE_MECHANISMS = (GAUSSIAN, NU_DPFTRL)
# Spellings of earlier versions (ledger events, the accountant CLI and endpoint): still read
# and accepted, always written back as the one name.
LEGACY_NAMES = {"dp-sgd": GAUSSIAN, "nu-dp-ftrl": NU_DPFTRL, "nu-dpftrl": NU_DPFTRL}


def canonical_mechanism(name: object) -> str:
    """The one name (``gaussian`` | ``nu_dpftrl``) of a mechanism given by any spelling."""
    if isinstance(name, str):
        name = LEGACY_NAMES.get(name, name)
        if name in NOISE_MECHANISMS:
            return str(name)
    spellings = (*NOISE_MECHANISMS, *LEGACY_NAMES)
    raise ValueError(f"unknown mechanism {name!r}; expected one of {spellings}")
