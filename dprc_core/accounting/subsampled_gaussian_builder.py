"""The PLD of a :class:`~dprc_core.accounting.events.SubsampledGaussianEvent`.

Per step, a dominating discrete sensitivity scale (a = 1 for exact norms; the envelope of §4
discretised with upper-edge rounding for hutch/hutch++, scale tail ≤ τ/(4q) at +∞), then the
pessimistic connect-the-dots PLD of both adjacencies: the revealed-scale mixture
(:mod:`~dprc_core.accounting.random_scale_pld`) for exact norms and shared sketches, the
hidden-scale mixture (:mod:`~dprc_core.accounting.hidden_scale_pld`) for
``sketch="per_example"``. The PLD is self-composed over the event's steps, and events equal
up to their step counts are one event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.events import (
    LEGACY_HIDDEN_SCALE_WIDTH,
    PER_EXAMPLE_SKETCH,
    SubsampledGaussianEvent,
)
from dprc_core.accounting.hidden_scale_pld import hidden_step_geometry, hidden_step_pld
from dprc_core.accounting.pld_builders import GridNeeds, PLDBuilder, pld_builder
from dprc_core.accounting.random_scale_pld import (
    StepGeometry,
    StepMechanism,
    step_geometry,
    step_pld,
)
from dprc_core.accounting.recent import Recent
from dprc_core.accounting.scale_distribution import (
    ScaleDistribution,
    envelope_scale,
    exact_scale,
)
from dprc_core.accounting.settings import AccountingSettings

_COARSE_WIDTH = 0.05  # scale bins used only to size the grid (a dominating, coarser scale)
# Largest finite scale in units of σ: beyond a/σ = 40 a step reveals the example anyway (losses
# of order 800), and the rest of the scale tail is sent to +∞ (charged to δ).
SCALE_CAP_SIGMAS = 40.0


def scale_distribution(
    event: SubsampledGaussianEvent, inf_budget: float, width: float
) -> ScaleDistribution:
    """Dominating discrete sensitivity scale of one step of ``event``."""
    if event.envelope == "exact":
        return exact_scale()
    rank = event.rank if event.envelope == "hutch" else None  # Hutch++: dimension-free
    assert event.k is not None
    return envelope_scale(
        event.k,
        rank,
        inf_budget,
        relative_width=width,
        a_cap=SCALE_CAP_SIGMAS * event.noise_multiplier,
    )


def hidden_scale(event: SubsampledGaussianEvent) -> bool:
    """Per-example sketches are accounted with the hidden-scale model (hidden_scale_pld.py);
    everything else — shared sketches, exact norms — with the revealed-scale mixture."""
    return event.sketch == PER_EXAMPLE_SKETCH


@dataclass(frozen=True)
class PreparedSubsampledGaussian:
    """One step's mechanism on the fine scale, and the geometry of its loss (coarse scale)."""

    event: SubsampledGaussianEvent
    mech: StepMechanism
    geometry: StepGeometry

    @property
    def compositions(self) -> int:
        return self.event.steps

    @property
    def scale_bins(self) -> int:
        return len(self.mech.scale.values)

    def grid_needs(self, settings: AccountingSettings) -> GridNeeds:
        """h ≤ rel_h·std·n^{-1/4} (std of the per-step loss, n steps), and the loss ranges of
        one step and of n steps (mean·n ± 12·√n·std plus one step's range)."""
        n = self.event.steps
        std = min(self.geometry.std.values())
        h = settings.rel_h * std * n**-0.25 if std > 0 else math.inf
        step_range = 0.0
        composed_range = 0.0
        for d in self.geometry.lims:
            lo, hi = self.geometry.lims[d]
            step_range = max(step_range, hi - lo)
            composed_range = max(
                composed_range,
                n * abs(self.geometry.mean[d])
                + 12.0 * math.sqrt(n) * self.geometry.std[d]
                + (hi - lo),
            )
        return GridNeeds(h, step_range, composed_range)

    def pld(self, h: float, tail: float) -> PrivacyLossDistribution:
        build = hidden_step_pld if hidden_scale(self.event) else step_pld
        return build(self.mech, h, tail, self.geometry)


def clear_step_cache() -> None:
    """Forget the cached steps (:func:`_one_step`) and the seeded ones (:func:`seed_step`)."""
    _one_step.cache_clear()
    _SEEDED.clear()


_StepKey = tuple[SubsampledGaussianEvent, float, AccountingSettings]
_SEEDED: Recent[_StepKey, tuple[StepMechanism, StepGeometry]] = Recent(1024)  # as _one_step's


def seed_step(
    event: SubsampledGaussianEvent,
    tail: float,
    settings: AccountingSettings,
    step: tuple[StepMechanism, StepGeometry],
) -> None:
    """Keep ``step`` — ``event``'s one step at ``tail``, as :func:`step_of` computed it in
    another process (:mod:`dprc_core.accounting.accountant_process`) — for this process's
    :meth:`SubsampledGaussianPLD.prepare` (least recently used dropped beyond 1,024)."""
    key = (replace(event, steps=1), tail, settings)
    _SEEDED.put(key, step)


def step_of(
    event: SubsampledGaussianEvent, tail: float, settings: AccountingSettings
) -> tuple[StepMechanism, StepGeometry]:
    """``event``'s one step at ``tail``: its mechanism (fine scale) and loss geometry, seeded
    (:func:`seed_step`) or cached (:func:`_one_step`)."""
    step = replace(event, steps=1)
    seeded = _SEEDED.get((step, tail, settings))
    return seeded if seeded is not None else _one_step(step, tail, settings)


@pld_builder(SubsampledGaussianEvent)
class SubsampledGaussianPLD(PLDBuilder[SubsampledGaussianEvent]):
    """Steps are self-compositions of one step's PLD; equal events merge their steps."""

    mergeable_steps = True

    def prepare(
        self, event: SubsampledGaussianEvent, tail: float, settings: AccountingSettings
    ) -> PreparedSubsampledGaussian:
        mech, geometry = step_of(event, tail, settings)
        return PreparedSubsampledGaussian(event, mech, geometry)


@lru_cache(maxsize=1024)  # ≤ ~16 MB: a fine hidden-scale law is ~1,000 atoms × 16 bytes
def _one_step(
    step: SubsampledGaussianEvent, tail: float, settings: AccountingSettings
) -> tuple[StepMechanism, StepGeometry]:
    """One step's mechanism (fine scale) and loss geometry (coarse scale): neither depends on
    the number of steps, so the events of one job — planned, then settled after each number of
    steps — and its repeated compositions share them (the same values, computed once)."""
    inf_budget = tail / (4.0 * step.sample_rate)
    # the hidden-scale law is the event's own (the one it was planned and charged on), made
    # finer by settings asking for a finer one (AccountingSettings.finer); never coarser
    width = settings.width_for(hidden_scale(step), step.scale_width)
    fine = scale_distribution(step, inf_budget, width)
    coarse = scale_distribution(step, inf_budget, max(_COARSE_WIDTH, width))
    sigma, q = step.noise_multiplier, step.sample_rate
    if hidden_scale(step):
        # an event on the legacy law keeps the legacy loss range too: its ε to the last digit
        legacy = step.scale_width == LEGACY_HIDDEN_SCALE_WIDTH
        geometry = hidden_step_geometry(StepMechanism(sigma, q, coarse), tail, legacy)
    else:
        geometry = step_geometry(StepMechanism(sigma, q, coarse), tail)
    return StepMechanism(sigma, q, fine), geometry
