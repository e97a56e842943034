"""Composition of privacy events into one pessimistic PLD, and ε for a target δ.

Pipeline for a list of events and a target δ (docs/accounting.md has the soundness argument):

1. Tail budget: every truncation may cost at most ``tail_fraction·δ`` in total, i.e.
   ``τ = tail_fraction·δ / Σ steps`` per step.
2. Per event, a dominating discrete scale distribution (a = 1 for exact clipping; the envelope
   of §4 discretised with upper-edge rounding for hutch/hutch++, scale tail ≤ τ/(4q) at +∞).
3. The loss grid h: ``rel_h · std · n^{-1/4}`` (std of the per-step loss, n steps), the smallest
   over events, clipped to [h_min, h_max] and enlarged if one step's loss range would need
   more than ``max_step_grid`` points or the composed one more than ``max_grid``. When the
   bulk of the loss drives ε, the connect-the-dots error of the composition scales as
   √n·h²/std², so this keeps it at a fixed small level (a few 0.01%); when a long loss tail
   drives it (tiny q), a grid of 2^17 points over the step's loss range is ample.
4. Per-step PLD (both adjacencies) by connect-the-dots on that grid — the revealed-scale
   mixture (:mod:`random_scale_pld`) for exact norms and shared sketches, the hidden-scale
   mixture (:mod:`hidden_scale_pld`) for ``sketch="per_example"`` events — ``self_compose(steps)``
   and ``compose`` across events with ``dp_accounting``; ε from the composed PMFs.

A ν-DP-FTRL event is one Gaussian mechanism for its whole run (μ = sensitivity/σ, no
sampling): its PLD is ``dp_accounting``'s Gaussian PLD, pessimistic connect-the-dots on the
same grid, composed with the others (a PLD composition, never a sum of ε's). Its loss has
std μ, so it asks for h ≤ rel_h·μ like a one-step event.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.dpftrl import gaussian_epsilon
from dprc_core.accounting.events import NU_DPFTRL, PER_EXAMPLE_SKETCH, PrivacyEvent, check_delta
from dprc_core.accounting.hidden_scale_pld import hidden_step_geometry, hidden_step_pld
from dprc_core.accounting.pld_epsilon import epsilon_from_pld
from dprc_core.accounting.random_scale_pld import (
    StepGeometry,
    StepMechanism,
    step_geometry,
    step_pld,
)
from dprc_core.accounting.scale_distribution import (
    DEFAULT_RELATIVE_WIDTH,
    ScaleDistribution,
    envelope_scale,
    exact_scale,
)

_COARSE_WIDTH = 0.05  # scale bins used only to size the grid (a dominating, coarser scale)
# Largest finite scale in units of σ: beyond a/σ = 40 a step reveals the example anyway (losses
# of order 800), and the rest of the scale tail is sent to +∞ (charged to δ).
SCALE_CAP_SIGMAS = 40.0


@dataclass(frozen=True)
class AccountingSettings:
    """Discretisation knobs. Every setting yields an upper bound; they trade time for
    tightness. :meth:`finer` divides both resolutions by a factor (the "10× finer" check)."""

    rel_h: float = 0.5
    scale_width: float = DEFAULT_RELATIVE_WIDTH
    tail_fraction: float = 1e-3
    h_min: float = 1e-8
    h_max: float = 1e-3
    max_step_grid: int = 1 << 17
    max_grid: int = 1 << 22

    def finer(self, factor: float = 10.0) -> AccountingSettings:
        return replace(
            self,
            rel_h=self.rel_h / factor,
            scale_width=self.scale_width / factor,
            h_min=self.h_min / factor,
            h_max=self.h_max / factor,
            max_step_grid=int(self.max_step_grid * factor),
            max_grid=int(self.max_grid * factor),
        )


DEFAULT_SETTINGS = AccountingSettings()


def scale_distribution(event: PrivacyEvent, inf_budget: float, width: float) -> ScaleDistribution:
    """Dominating discrete sensitivity scale of one step of ``event``."""
    if event.clipping == "exact":
        return exact_scale()
    rank = event.rank if event.clipping == "hutch" else None  # Hutch++: dimension-free
    assert event.k is not None
    return envelope_scale(
        event.k,
        rank,
        inf_budget,
        relative_width=width,
        a_cap=SCALE_CAP_SIGMAS * event.noise_multiplier,
    )


@dataclass(frozen=True)
class _Prepared:
    event: PrivacyEvent
    mech: StepMechanism
    geometry: StepGeometry


def _hidden_scale(event: PrivacyEvent) -> bool:
    """Per-example sketches are accounted with the hidden-scale model (hidden_scale_pld.py);
    everything else — shared sketches, exact norms — with the revealed-scale mixture."""
    return event.sketch == PER_EXAMPLE_SKETCH


def _prepare(event: PrivacyEvent, tail: float, settings: AccountingSettings) -> _Prepared:
    inf_budget = tail / (4.0 * event.sample_rate)
    fine = scale_distribution(event, inf_budget, settings.scale_width)
    coarse = scale_distribution(event, inf_budget, max(_COARSE_WIDTH, settings.scale_width))
    geometry_of = hidden_step_geometry if _hidden_scale(event) else step_geometry
    geometry = geometry_of(StepMechanism(event.noise_multiplier, event.sample_rate, coarse), tail)
    return _Prepared(
        event, StepMechanism(event.noise_multiplier, event.sample_rate, fine), geometry
    )


def _step_pld(p: _Prepared, h: float, tail: float) -> PrivacyLossDistribution:
    """The per-step PLD of a prepared DP-SGD event in its own model (see :func:`_hidden_scale`)."""
    build = hidden_step_pld if _hidden_scale(p.event) else step_pld
    return build(p.mech, h, tail, p.geometry)


def choose_grid(
    prepared: Sequence[_Prepared],
    settings: AccountingSettings,
    gaussian_mus: Sequence[float] = (),
) -> float:
    """The common loss-grid interval h for a set of events (see module docstring);
    ``gaussian_mus``: the μ of whole-run Gaussian (ν-DP-FTRL) events, loss ~ N(μ²/2, μ²)."""
    h = settings.h_max
    composed_range = 0.0
    step_range = 0.0
    for mu in gaussian_mus:
        h = min(h, settings.rel_h * mu)
        composed_range = max(composed_range, mu * mu / 2 + 12.0 * mu)
        step_range = max(step_range, mu * mu + 24.0 * mu)
    for p in prepared:
        n = p.event.steps
        std = min(p.geometry.std.values())
        if std > 0:
            h = min(h, settings.rel_h * std * n**-0.25)
        for d in p.geometry.lims:
            lo, hi = p.geometry.lims[d]
            step_range = max(step_range, hi - lo)
            composed_range = max(
                composed_range,
                n * abs(p.geometry.mean[d]) + 12.0 * math.sqrt(n) * p.geometry.std[d] + (hi - lo),
            )
    h = max(h, settings.h_min)
    return max(h, step_range / settings.max_step_grid, composed_range / settings.max_grid)


def _merge(events: Sequence[PrivacyEvent]) -> list[PrivacyEvent]:
    """DP-SGD events equal up to their step counts are one event (composition is
    commutative). ν-DP-FTRL events are never merged: the steps of a run enter its sensitivity,
    and two runs are two Gaussian mechanisms, not one longer run."""
    merged: dict[tuple, int] = {}
    others: list[PrivacyEvent] = []
    for e in events:
        if e.mechanism == NU_DPFTRL:
            others.append(e)
            continue
        key = (e.noise_multiplier, e.sample_rate, e.clipping, e.k, e.rank, e.mechanism, e.sketch)
        merged[key] = merged.get(key, 0) + e.steps
    return [
        PrivacyEvent(sig, q, steps, clip, k, rank, mech, sketch=sketch)
        for (sig, q, clip, k, rank, mech, sketch), steps in merged.items()
    ] + others


def _gaussian_pld(mu: float, h: float, tail: float) -> PrivacyLossDistribution:
    """Pessimistic (connect-the-dots) PLD of the Gaussian mechanism with sensitivity μ, σ = 1;
    the truncated x-tails (mass ≤ tail) go to +∞ loss, i.e. into δ."""
    return pld_lib.from_gaussian_mechanism(
        1.0,
        sensitivity=mu,
        pessimistic_estimate=True,
        value_discretization_interval=h,
        log_mass_truncation_bound=math.log(tail),
        use_connect_dots=True,
    )


@dataclass(frozen=True)
class AccountingResult:
    """ε and the discretisation that produced it."""

    epsilon: float
    delta: float
    grid_interval: float
    scale_bins: tuple[int, ...]
    tail_budget_per_step: float
    settings: AccountingSettings

    def describe(self) -> str:
        if math.isnan(self.grid_interval):
            return (
                "exact: nu_dpftrl runs only, Gaussian mechanisms composing to one Gaussian "
                "with mu = sqrt(sum mu_i^2), analytic epsilon"
            )
        bins = ", ".join(str(b) for b in self.scale_bins)
        return (
            f"loss grid h={self.grid_interval:.3g}, scale bins per event=[{bins}] "
            f"(relative width {self.settings.scale_width:g}), truncated tails "
            f"≤ {self.settings.tail_fraction:g}·δ, pessimistic connect-the-dots PLD"
        )


def compose_events(
    events: Sequence[PrivacyEvent],
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> tuple[PrivacyLossDistribution, AccountingResult]:
    """One pessimistic PLD for the composition of all ``events`` (sized for target δ), and a
    description of the discretisation (its ``epsilon`` field is NaN: see :func:`account`)."""
    if not events:
        raise ValueError("no privacy events to compose")
    delta = check_delta(delta)
    events = _merge(events)
    sgd = [e for e in events if e.mechanism != NU_DPFTRL]
    gaussians = [e for e in events if e.mechanism == NU_DPFTRL]
    # a whole ν-DP-FTRL run is one mechanism: it counts as one "step" in the tail budget
    total_steps = sum(e.steps for e in sgd) + len(gaussians)
    tail = settings.tail_fraction * delta / total_steps
    truncation = min(1e-15, 1e-3 * delta)
    prepared = [_prepare(e, tail, settings) for e in sgd]
    h = choose_grid(prepared, settings, [e.mu for e in gaussians])
    result: PrivacyLossDistribution | None = None
    plds: list[tuple[PrivacyLossDistribution, int]] = [
        (_step_pld(p, h, tail), p.event.steps) for p in prepared
    ]
    plds += [(_gaussian_pld(e.mu, h, tail), 1) for e in gaussians]
    for pld, steps in plds:
        # dp_accounting's Chernoff bounds take logsumexp over PMFs with many exact zeros, which
        # raises harmless overflow warnings inside scipy; the results are unaffected.
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if steps > 1:
                pld = pld.self_compose(steps, tail_mass_truncation=truncation)
            if result is not None:
                pld = result.compose(pld, tail_mass_truncation=truncation)
        result = pld
    assert result is not None
    bins = tuple(len(p.mech.scale.values) for p in prepared) + (1,) * len(gaussians)
    info = AccountingResult(math.nan, delta, h, bins, tail, settings)
    return result, info


def account(
    events: Sequence[PrivacyEvent],
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> AccountingResult:
    """Upper bound on ε at ``delta`` for the composition of ``events``, with its settings.

    When every event is a ν-DP-FTRL run (a Gaussian mechanism with μ_i), the composition is
    exactly the Gaussian mechanism with μ = sqrt(Σ μ_i²) and ε is analytic (no discretisation;
    the same value as :func:`dprc_core.accounting.dpftrl_epsilon` for a single run, so a σ
    calibrated by ``dpftrl_noise_multiplier`` meets its target in the ledger too)."""
    if events and all(e.mechanism == NU_DPFTRL for e in events):
        mu = math.sqrt(sum(e.mu**2 for e in events))
        eps = gaussian_epsilon(mu, check_delta(delta))
        return AccountingResult(eps, delta, math.nan, (1,) * len(events), 0.0, settings)
    pld, info = compose_events(events, delta, settings)
    return replace(info, epsilon=epsilon_from_pld(pld, info.delta))


def epsilon_for_events(
    events: Sequence[PrivacyEvent],
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> float:
    """Upper bound on ε at ``delta`` for the composition of ``events``."""
    return account(events, delta, settings).epsilon
