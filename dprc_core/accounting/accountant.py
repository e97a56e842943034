"""Composition of privacy events into one pessimistic PLD, and ε for a target δ.

Pipeline for a list of events and a target δ (docs/accounting.md has the soundness argument):

1. Merge: events their builder marks ``mergeable_steps`` and equal up to their step counts
   are one event (composition is commutative).
2. Tail budget: every truncation may cost at most ``tail_fraction·δ`` in total, i.e.
   ``τ = tail_fraction·δ / Σ compositions`` per composition (a DP-SGD step, a whole
   ν-DP-FTRL run).
3. Per event, its registered builder (:mod:`dprc_core.accounting.pld_builders`) prepares it
   for τ: :mod:`~dprc_core.accounting.subsampled_gaussian_builder` (a dominating discrete
   scale distribution and the revealed- or hidden-scale mixture) and
   :mod:`~dprc_core.accounting.nu_dpftrl_builder` (one Gaussian mechanism per run).
4. The loss grid h (:func:`choose_grid`): the smallest interval any event asks for (for
   DP-SGD ``rel_h · std · n^{-1/4}``, std of the per-step loss, n steps), clipped to
   [h_min, h_max] and enlarged if one composition's loss range would need more than
   ``max_step_grid`` points or the composed one more than ``max_grid``. When the bulk of the
   loss drives ε, the connect-the-dots error of the composition scales as √n·h²/std², so this
   keeps it at a fixed small level (a few 0.01%); when a long loss tail drives it (tiny q), a
   grid of 2^17 points over the step's loss range is ample.
5. Each event's PLD on that grid, composed with itself over its compositions, and across
   events (:mod:`pld_self_compose`: dp_accounting's self-composition and composition, their
   truncation bounds vectorised); ε from the composed PMFs.

When every event is exactly a Gaussian mechanism (ν-DP-FTRL runs), the composition is the
Gaussian mechanism with μ = sqrt(Σ μ_i²) and ε is analytic. The accountant supports the event
classes in :data:`SUPPORTED_EVENTS` and refuses others with ``UnsupportedMechanismError``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.dpftrl import gaussian_epsilon
from dprc_core.accounting.events import (
    NuDPFTRLEvent,
    PrivacyEvent,
    SubsampledGaussianEvent,
    UnsupportedMechanismError,
    check_delta,
)
from dprc_core.accounting.nu_dpftrl_builder import gaussian_pld
from dprc_core.accounting.pld_builders import PreparedEvent, builder_for
from dprc_core.accounting.pld_epsilon import epsilon_from_pld
from dprc_core.accounting.pld_self_compose import compose, self_compose
from dprc_core.accounting.settings import DEFAULT_SETTINGS, AccountingSettings
from dprc_core.accounting.subsampled_gaussian_builder import (
    SCALE_CAP_SIGMAS,
    scale_distribution,
)

__all__ = [
    "DEFAULT_SETTINGS",
    "SCALE_CAP_SIGMAS",
    "SUPPORTED_EVENTS",
    "AccountingResult",
    "AccountingSettings",
    "account",
    "check_supported",
    "choose_grid",
    "compose_events",
    "compositions",
    "epsilon_for_events",
    "gaussian_composition_mu",
    "gaussian_pld",
    "prepare",
    "scale_distribution",
]

# The event classes this accountant composes (each has its PLD builder registered).
SUPPORTED_EVENTS: tuple[type[PrivacyEvent], ...] = (SubsampledGaussianEvent, NuDPFTRLEvent)


def check_supported(events: Sequence[PrivacyEvent]) -> None:
    """``UnsupportedMechanismError`` for an event of a class this accountant does not know."""
    for e in events:
        if type(e) not in SUPPORTED_EVENTS:
            raise UnsupportedMechanismError(
                f"the PLD accountant does not support {type(e).__name__} events; it supports "
                f"{', '.join(t.__name__ for t in SUPPORTED_EVENTS)}"
            )


def prepare(event: PrivacyEvent, tail: float, settings: AccountingSettings) -> PreparedEvent:
    """``event`` made ready by its builder for a per-composition tail budget ``tail``."""
    return builder_for(event).prepare(event, tail, settings)


def compositions(event: PrivacyEvent) -> int:
    """How many mechanisms ``event`` counts as in the tail budget."""
    return builder_for(event).compositions(event)


def gaussian_composition_mu(events: Sequence[PrivacyEvent]) -> float | None:
    """μ = sqrt(Σ μ_i²) when every event is exactly a Gaussian mechanism (their composition
    is one), else None."""
    mus = [builder_for(e).gaussian_mu(e) for e in events]
    if not mus or any(mu is None for mu in mus):
        return None
    return math.sqrt(sum(mu**2 for mu in mus if mu is not None))


def choose_grid(prepared: Sequence[PreparedEvent], settings: AccountingSettings) -> float:
    """The common loss-grid interval h for a set of prepared events (module docstring, 4)."""
    h = settings.h_max
    composed_range = 0.0
    step_range = 0.0
    for p in prepared:
        needs = p.grid_needs(settings)
        h = min(h, needs.h)
        step_range = max(step_range, needs.step_range)
        composed_range = max(composed_range, needs.composed_range)
    h = max(h, settings.h_min)
    return max(h, step_range / settings.max_step_grid, composed_range / settings.max_grid)


def _with_steps(event: PrivacyEvent, steps: int) -> PrivacyEvent:
    """The same event with ``steps`` steps (every event class is a dataclass)."""
    new: PrivacyEvent = replace(cast(Any, event), steps=steps)
    return new


def _merge(events: Sequence[PrivacyEvent]) -> list[PrivacyEvent]:
    """Mergeable events equal up to their step counts as one event with the steps summed (in
    the order they first appear), then the others in their order."""
    merged: dict[Hashable, PrivacyEvent] = {}
    others: list[PrivacyEvent] = []
    for e in events:
        if not builder_for(e).mergeable_steps:
            others.append(e)
            continue
        key = _with_steps(e, 1)
        seen = merged.get(key)
        merged[key] = e if seen is None else _with_steps(seen, seen.steps + e.steps)
    return list(merged.values()) + others


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
    check_supported(events)
    delta = check_delta(delta)
    events = _merge(events)
    tail = settings.tail_fraction * delta / sum(compositions(e) for e in events)
    truncation = min(1e-15, 1e-3 * delta)
    prepared = [prepare(e, tail, settings) for e in events]
    h = choose_grid(prepared, settings)
    result: PrivacyLossDistribution | None = None
    for p in prepared:
        pld = p.pld(h, tail)
        # the Chernoff bounds' exponents over PMFs with many exact zeros may overflow
        # harmlessly; the results are unaffected
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if p.compositions > 1:
                pld = self_compose(pld, p.compositions, truncation)
            if result is not None:
                pld = compose(result, pld, truncation)
        result = pld
    assert result is not None
    bins = tuple(p.scale_bins for p in prepared)
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
    check_supported(events)
    mu = gaussian_composition_mu(events)
    if mu is not None:
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
