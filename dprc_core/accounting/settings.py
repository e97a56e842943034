"""The accountant's discretisation knobs (docs/accounting.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dprc_core.accounting.scale_distribution import DEFAULT_RELATIVE_WIDTH


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
