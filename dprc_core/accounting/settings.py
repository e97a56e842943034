"""The accountant's discretisation knobs (docs/accounting.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dprc_core.accounting.scale_distribution import DEFAULT_RELATIVE_WIDTH

# Relative width of the scale bins of the hidden-scale model (per-example sketches,
# docs/accounting.md §10). Its per-step PLD mixes over every atom at every support point, so
# the atoms are its cost: 1 % (~80 atoms at k = 32) instead of 0.1 % (~800) makes a step
# PLD several times cheaper for about +0.5–1 % of ε. Any width is sound: each bin's mass sits
# at its upper edge, so the law dominates the envelope whatever the width (§3 item 1, §10).
HIDDEN_SCALE_WIDTH = 0.01


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

    def width_for(self, hidden: bool) -> float:
        """The scale bins' relative width of an event: ``hidden_scale_width`` for the
        hidden-scale model (per-example sketches), ``scale_width`` for every other."""
        return self.hidden_scale_width if hidden else self.scale_width


DEFAULT_SETTINGS = AccountingSettings()
