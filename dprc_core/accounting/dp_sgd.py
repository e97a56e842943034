"""ε of DP-SGD / DP-SGD-RC (the public ``epsilon`` function)."""

from __future__ import annotations

from dprc_core.accounting.accountant import DEFAULT_SETTINGS, AccountingSettings, account
from dprc_core.accounting.events import SHARED_SKETCH, SubsampledGaussianEvent, check_delta
from dprc_core.accounting.renamed_keywords import renamed_keyword


@renamed_keyword("clipping", "envelope")
def epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    envelope: str = "exact",
    k: int | None = None,
    rank: int | None = None,
    *,
    sketch: str = SHARED_SKETCH,
    settings: AccountingSettings = DEFAULT_SETTINGS,
    clipping: str | None = None,
) -> float:
    """Upper bound on ε at ``delta`` for ``steps`` Poisson-subsampled DP-SGD steps
    (:class:`SubsampledGaussianEvent`).

    Add/remove adjacency, Poisson sampling with rate ``sample_rate``, ε the larger of the two
    directions. ``envelope="exact"`` is the plain subsampled Gaussian; ``"hutch"`` /
    ``"hutchpp"`` use the random sensitivity scale of the envelope CDF with projection
    dimension ``k`` (rank=None: dimension-free envelope; rank=D: the Proposition 1 envelope for
    Hutch with total rank D = Σ_l min(p_l, d_l) over randomized layers, valid only if every
    clipped layer is randomized; Hutch++ always uses the dimension-free envelope).
    ``sketch``: ``"shared"`` (one projection per layer per step, revealed-scale model) or
    ``"per_example"`` (independent per-example projections, hidden-scale model,
    docs/accounting.md §10; randomized envelopes only). ``clipping``: the deprecated name of
    ``envelope``. Returns ``math.inf`` when no finite ε reaches ``delta``.
    """
    event = SubsampledGaussianEvent(noise_multiplier, sample_rate, steps, envelope, k, rank, sketch)
    return account([event], check_delta(delta), settings).epsilon
