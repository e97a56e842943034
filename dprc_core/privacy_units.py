"""Privacy units larger than one row: the rows of a micro-batch grouped by the user they belong
to, so that the engine clips each **user's** gradient (the sum over that user's rows) instead of
each row's (user-level DP-SGD, docs/privacy_unit.md).

Every layer handler gives a row's gradient as a sum over its positions: a matrix parameter's
``L_iᵀ R_i = Σ_t l_{i,t} r_{i,t}ᵀ`` (factors (B, T, ·)), a vector parameter's per-row gradient
(B, n). A user's gradient ``Σ_{i∈u} L_iᵀ R_i`` is therefore the contribution of one long "row"
whose positions are all the positions of the user's rows: :func:`group_contribution` lays the
rows of each user end to end (U, M·T, ·), M the most rows any user has, padding shorter users
with zero positions (a zero dense factor row, or a one-hot index −1, contributes nothing). The
norm methods — exact (ghost or materialised), Hutchinson, Hutch++ — then see U samples and give
each user's norm with the same code, and the book-keeping clipped sum weights each user's
contribution by its own clipping factor. A vector parameter's per-user gradient is the sum of
its rows' (``index_add``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dprc_core.estimators import Factor, MatrixContribution, OneHot

MAX_KEY = 1 << 62  # keys (user ids) are integers in [0, 2**62), as example ids


@dataclass(frozen=True)
class UnitGroups:
    """The rows of one micro-batch grouped by privacy unit.

    ``unit[i]`` is row i's unit in 0..U−1 (units numbered in order of first appearance),
    ``slot[i]`` its position among its unit's rows, ``keys[u]`` the unit's key (the user id)."""

    unit: torch.Tensor  # (B,) long
    slot: torch.Tensor  # (B,) long
    keys: tuple[int, ...]
    most_rows: int  # M: the most rows of any unit

    @property
    def size(self) -> int:
        return len(self.keys)

    @property
    def rows(self) -> int:
        return int(self.unit.numel())

    def rows_of(self, units: torch.Tensor) -> torch.Tensor:
        """The rows (indices, ascending) whose unit is in ``units`` (a (U,) bool mask)."""
        return torch.nonzero(units.to(self.unit.device)[self.unit]).flatten()

    def all_rows(self, ok: torch.Tensor) -> torch.Tensor:
        """(U,) bool: every row of the unit has ``ok`` (a (B,) bool)."""
        bad = torch.zeros(self.size, dtype=torch.long, device=ok.device)
        bad.index_add_(0, self.unit.to(ok.device), (~ok).long())
        return bad == 0

    def subset(self, rows: torch.Tensor) -> UnitGroups:
        """The groups of the micro-batch made of ``rows`` (indices) of this one."""
        keys = [self.keys[u] for u in self.unit[rows.to(self.unit.device)].tolist()]
        return group_rows(keys)


def group_rows(user_ids: Any) -> UnitGroups:
    """Group a micro-batch's rows by their users' ids (a sequence or tensor of integers in
    [0, 2**62), one per row)."""
    ids = [int(i) for i in torch.as_tensor(user_ids).reshape(-1).tolist()]
    if any(i < 0 or i >= MAX_KEY for i in ids):
        raise ValueError("user_ids must be integers in [0, 2**62)")
    number: dict[int, int] = {}
    counts: list[int] = []
    unit, slot = [], []
    for key in ids:
        u = number.setdefault(key, len(number))
        if u == len(counts):
            counts.append(0)
        unit.append(u)
        slot.append(counts[u])
        counts[u] += 1
    return UnitGroups(
        torch.tensor(unit, dtype=torch.long),
        torch.tensor(slot, dtype=torch.long),
        tuple(number),
        max(counts, default=0),
    )


def _group_factor(f: Factor, groups: UnitGroups) -> Factor:
    """(B, T, d) → (U, M·T, d): each unit's rows end to end, zero positions after them."""
    if isinstance(f, OneHot):
        b, t = f.indices.shape
        out = torch.full(
            (groups.size, groups.most_rows, t), -1, dtype=f.indices.dtype, device=f.indices.device
        )
        out[groups.unit.to(out.device), groups.slot.to(out.device)] = f.indices
        return OneHot(out.reshape(groups.size, groups.most_rows * t), f.size)
    b, t, d = f.shape
    dense = torch.zeros(groups.size, groups.most_rows, t, d, dtype=f.dtype, device=f.device)
    dense[groups.unit.to(f.device), groups.slot.to(f.device)] = f
    return dense.reshape(groups.size, groups.most_rows * t, d)


def group_contribution(c: Any, groups: UnitGroups) -> Any:
    """A parameter's per-row contribution made per-unit (see the module docstring)."""
    if groups.size == groups.rows and groups.most_rows <= 1:
        return c  # one row per unit: the rows are the units, in order
    if isinstance(c, MatrixContribution):
        return MatrixContribution(_group_factor(c.left, groups), _group_factor(c.right, groups))
    out = torch.zeros(groups.size, *c.shape[1:], dtype=c.dtype, device=c.device)
    return out.index_add_(0, groups.unit.to(c.device), c)


__all__ = ["MAX_KEY", "UnitGroups", "group_contribution", "group_rows"]
