"""The accountant's discretisation knobs (docs/accounting.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dprc_core.accounting.event_checks import HIDDEN_SCALE_WIDTH
from dprc_core.accounting.scale_distribution import DEFAULT_RELATIVE_WIDTH

# HIDDEN_SCALE_WIDTH (event_checks.py, 0.01): relative width of the scale bins of the
# hidden-scale model (per-example sketches, docs/accounting.md §10). Its per-step PLD mixes
# over every atom at every support point, so the atoms are its cost: 1 % (~80 atoms at k = 32)
# instead of 0.1 % (~800) makes a step PLD several times cheaper for about +0.5–1 % of ε. Any
# width is sound: each bin's mass sits at its upper edge, so the law dominates the envelope
# whatever the width (§3 item 1, §10). It is the law of the events built now; each event
# carries its own (SubsampledGaussianEvent.scale_width), and the accountant uses the finer of
# the event's law and ``hidden_scale_width`` below (so ``finer`` still refines).
__all__ = ["DEFAULT_SETTINGS", "HIDDEN_SCALE_WIDTH", "AccountingSettings"]


@dataclass(frozen=True)
class AccountingSettings:
    """Discretisation knobs. Every setting yields an upper bound; they trade time for
    tightness. :meth:`finer` divides both resolutions by a factor (the "10× finer" check)."""

    rel_h: float = 0.5
    scale_width: float = DEFAULT_RELATIVE_WIDTH
    hidden_scale_width: float = HIDDEN_SCALE_WIDTH
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
            hidden_scale_width=self.hidden_scale_width / factor,
            h_min=self.h_min / factor,
            h_max=self.h_max / factor,
            max_step_grid=int(self.max_step_grid * factor),
            max_grid=int(self.max_grid * factor),
        )

    def width_for(self, hidden: bool, event_width: float | None = None) -> float:
        """The scale bins' relative width of an event: for the hidden-scale model (per-example
        sketches) the finer of the event's own law (``event_width``; None: none) and
        ``hidden_scale_width``; ``scale_width`` for every other."""
        if not hidden:
            return self.scale_width
        if event_width is None:
            return self.hidden_scale_width
        return min(event_width, self.hidden_scale_width)


DEFAULT_SETTINGS = AccountingSettings()
