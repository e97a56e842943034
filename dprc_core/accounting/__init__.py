"""Privacy accounting for DP-SGD and DP-SGD with randomized clipping (docs/design.md §4).

Public API::

    epsilon(noise_multiplier, sample_rate, steps, delta, envelope="exact", k=None, rank=None)
    noise_multiplier(target_epsilon, target_delta, sample_rate, steps, envelope="exact", ...,
                     sketch="shared")   # "per_example": hidden-scale model (§10)
    calibrate(make_event, target_epsilon, target_delta)   # σ for any event family make_event(σ)
    SubsampledGaussianEvent(sigma, q, steps, "hutch", 32, sketch="per_example")   # one event
    NuDPFTRLEvent(sigma, steps, nu, participations, min_separation, bands=None)  # one class each
    NuDPFTRLEvent.prefix(sigma, steps, nu, min_separation, bands=None)  # a run's first steps
    PrivacyEvent.from_dict(d)          # the registered class d["mechanism"] names
    envelope_cdf(x, k, rank=None)     # F(x; Y), an upper bound on P(Y ≤ x) for every spectrum
    x_plus(k, rank)                    # Proposition 1 threshold
    PrivacyLedger().record(event); .epsilon(delta); .to_json(); PrivacyLedger.from_json(s)
    dpftrl_sensitivity(nu, steps, participations, min_separation, bands=None)   # ν-DP-FTRL
    dpftrl_epsilon(noise_multiplier, delta, nu, steps, participations, min_separation, bands)
    dpftrl_noise_multiplier(target_epsilon, target_delta, nu, steps, participations, ...)

Every DP-SGD ε is an upper bound for add/remove adjacency under Poisson sampling (the larger of
the two directions); ν-DP-FTRL (fixed-order batches, no amplification) is accounted under
zero-out adjacency, which DP-SGD's add/remove guarantee implies, so the ledger composes both;
see docs/accounting.md for the constructions and their soundness arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dprc_core.lazy_import import lazy_names

if TYPE_CHECKING:  # the real imports, for type checkers and IDEs
    from dprc_core.accounting.accountant import (
        DEFAULT_SETTINGS,
        AccountingResult,
        AccountingSettings,
        account,
        epsilon_for_events,
    )
    from dprc_core.accounting.calibration import calibrate, noise_multiplier
    from dprc_core.accounting.dp_sgd import epsilon
    from dprc_core.accounting.dpftrl import (
        dpftrl_epsilon,
        dpftrl_noise_multiplier,
        dpftrl_sensitivity,
    )
    from dprc_core.accounting.envelope import RANK_ENVELOPE_MAX, envelope_cdf, x_plus
    from dprc_core.accounting.events import (
        CLIPPINGS,
        ENVELOPES,
        PER_EXAMPLE_SKETCH,
        SHARED_SKETCH,
        SKETCHES,
        NuDPFTRLEvent,
        PrivacyEvent,
        SubsampledGaussianEvent,
        UnsupportedMechanismError,
    )
    from dprc_core.accounting.ledger import PrivacyLedger
    from dprc_core.accounting.pld_builders import PLDBuilder, pld_builder

# each public name -> the submodule it is imported from on first use (as dprc_core's own
# names): ``import dprc_core.accounting`` loads neither numpy nor dp_accounting, so the
# ``dprc accountant`` command's options (cli_args) parse before anything heavy is imported
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        ("DEFAULT_SETTINGS", "AccountingResult", "AccountingSettings", "account",
         "epsilon_for_events"),
        "accountant",
    ),
    **dict.fromkeys(("calibrate", "noise_multiplier"), "calibration"),
    "epsilon": "dp_sgd",
    **dict.fromkeys(("dpftrl_epsilon", "dpftrl_noise_multiplier", "dpftrl_sensitivity"), "dpftrl"),
    **dict.fromkeys(("RANK_ENVELOPE_MAX", "envelope_cdf", "x_plus"), "envelope"),
    **dict.fromkeys(
        ("CLIPPINGS", "ENVELOPES", "PER_EXAMPLE_SKETCH", "SHARED_SKETCH", "SKETCHES",
         "NuDPFTRLEvent", "PrivacyEvent", "SubsampledGaussianEvent",
         "UnsupportedMechanismError"),
        "events",
    ),
    "PrivacyLedger": "ledger",
    **dict.fromkeys(("PLDBuilder", "pld_builder"), "pld_builders"),
}  # fmt: skip

__all__ = [
    "CLIPPINGS",
    "DEFAULT_SETTINGS",
    "ENVELOPES",
    "PER_EXAMPLE_SKETCH",
    "RANK_ENVELOPE_MAX",
    "SHARED_SKETCH",
    "SKETCHES",
    "AccountingResult",
    "AccountingSettings",
    "NuDPFTRLEvent",
    "PLDBuilder",
    "PrivacyEvent",
    "PrivacyLedger",
    "SubsampledGaussianEvent",
    "UnsupportedMechanismError",
    "account",
    "calibrate",
    "dpftrl_epsilon",
    "dpftrl_noise_multiplier",
    "dpftrl_sensitivity",
    "envelope_cdf",
    "epsilon",
    "epsilon_for_events",
    "noise_multiplier",
    "pld_builder",
    "x_plus",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
