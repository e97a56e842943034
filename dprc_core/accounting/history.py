"""ε of a growing history of privacy events (a data set's budget), composed incrementally.

A budgeted data set composes the events of all its jobs whenever a job is created, runs or
ends. :func:`dprc_core.accounting.accountant.compose_events` chooses its loss grid and tail
budget from the whole set of events, so two histories that differ by one event share no work:
each budget check would cost one full composition (seconds on a hundred events). Here the
discretisation is fixed by quantities that rarely change, and the work is cached:

* **Tail budget.** ``τ = tail_fraction·δ / S_b`` per step, where ``S_b`` is the smallest power
  of 4 that is ≥ the history's total steps (a ν-DP-FTRL run counts as one). Σ τ·steps ≤
  tail_fraction·δ as in ``compose_events``; τ changes only when the total crosses a power of 4.
* **Loss grid.** ``h`` is the largest power of two ≤ the interval ``choose_grid`` picks for
  the history's events at τ. Any h gives an upper bound (pessimistic connect-the-dots); a
  smaller h is only tighter and slower. h changes only when that interval crosses a power of 2.
* **Leaves.** Each event's PLD on (h, τ) — built by the event class's registered builder
  (:mod:`dprc_core.accounting.pld_builders`), as in ``compose_events``, self-composed over its
  compositions — is cached by the event and the grid.
* **Blocks.** The history is a sequence of slots in a stable order (a job's position on its
  data set; ``None`` for a job without an event yet). The composition of slots [0, n) is that
  of the first power-of-two block [0, m), m the largest power of two < n, with the
  composition of [m, n), recursively; every block is cached by its content and the grid.
  Appending an event or changing one slot recomposes O(log n) blocks.

Soundness: every leaf is a pessimistic PLD of its event, composition of pessimistic PLDs is
pessimistic, and tail truncation at each composition moves the truncated mass to the lowest
loss kept (left) or to +∞ (right), the pessimistic direction. The result is an upper bound on
ε for the composition of the history's events, like ``epsilon_for_events``; the two differ
only by discretisation (a history with a single event is accounted by ``epsilon_for_events``
itself, so a job calibrated to a budget fits it exactly). docs/accounting.md §11.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.accountant import (
    DEFAULT_SETTINGS,
    AccountingSettings,
    check_supported,
    choose_grid,
    compositions,
    epsilon_for_events,
    gaussian_composition_mu,
    prepare,
)
from dprc_core.accounting.events import PrivacyEvent, SubsampledGaussianEvent, check_delta
from dprc_core.accounting.pld_builders import PreparedEvent
from dprc_core.accounting.pld_epsilon import epsilon_from_pld
from dprc_core.accounting.pld_self_compose import compose, self_compose
from dprc_core.accounting.recent import Recent
from dprc_core.accounting.subsampled_gaussian_builder import (
    StepGeometry,
    StepMechanism,
    seed_step,
    step_of,
)

# Bytes of composed PMFs kept across calls (leaves and blocks of every history asked for).
CACHE_BYTES = 512 << 20


@dataclass(frozen=True)
class HistoryGrid:
    """The discretisation shared by every leaf and block of one history's composition."""

    h: float
    tail: float  # per step
    truncation: float  # tail mass truncated at each composition
    settings: AccountingSettings


def _steps_bucket(total: int) -> int:
    bucket = 1
    while bucket < total:
        bucket *= 4
    return bucket


def _power_of_two_below(x: float) -> float:
    return 2.0 ** math.floor(math.log2(x))


@lru_cache(maxsize=8192)
def _prepared(event: PrivacyEvent, tail: float, settings: AccountingSettings) -> PreparedEvent:
    return prepare(event, tail, settings)


def history_grid(
    events: Sequence[PrivacyEvent], delta: float, settings: AccountingSettings = DEFAULT_SETTINGS
) -> HistoryGrid:
    """The grid of a history's (non-empty) events at δ; see the module docstring. Cached by
    the events (a budget check asks for the grid of the same history several times), or
    seeded by :func:`seed_leaves`."""
    key = (tuple(events), delta, settings)
    seeded = _SEEDED_GRIDS.get(key)
    return seeded if seeded is not None else _history_grid(*key)


_SEEDED_GRIDS: Recent[tuple, HistoryGrid] = Recent(1024)  # as many as _history_grid's cache


def _history_tail(
    events: Sequence[PrivacyEvent], delta: float, settings: AccountingSettings
) -> float:
    """The per-step tail budget of a history's events (see the module docstring)."""
    return settings.tail_fraction * delta / _steps_bucket(sum(compositions(e) for e in events))


@lru_cache(maxsize=1024)
def _history_grid(
    events: tuple[PrivacyEvent, ...], delta: float, settings: AccountingSettings
) -> HistoryGrid:
    tail = _history_tail(events, delta, settings)
    prepared = [_prepared(e, tail, settings) for e in sorted(set(events), key=repr)]
    h = _power_of_two_below(choose_grid(prepared, settings))
    _TAILS.put((tail, settings), True)
    return HistoryGrid(h, tail, min(1e-15, 1e-3 * delta), settings)


# The tails at which this process has prepared a history's events, or been handed them
# (seed_leaves): a history at another tail prepares every event again (its steps, a new grid
# and every leaf on it), tens of milliseconds an event with randomized clipping.
_TAILS: Recent[tuple[float, AccountingSettings], bool] = Recent(64)


def tail_is_new(
    slots: Sequence[PrivacyEvent | None],
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> bool:
    """Whether :func:`epsilon_for_history` of ``slots`` would prepare the history's events at
    a tail this process has prepared no history at, nor been handed leaves for: a history
    whose total steps crossed a power of 4 since (every leaf is built again, on a new grid).
    False for a history that builds no leaf. A caller with an accountant process can have
    them built there first (:meth:`~dprc_core.accounting.accountant_process.AccountantProcess
    .build_leaves`), where the process's next history at that tail needs them anyway."""
    found = _leaf_events(slots, delta)
    if found is None:
        return False
    return _TAILS.get((_history_tail(found, check_delta(delta), settings), settings)) is None


class _BlockCache:
    """Least-recently-used composed PLDs, bounded by the bytes of their PMFs."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, tuple[PrivacyLossDistribution | None, int]] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()

    def get(self, key: tuple) -> tuple[bool, PrivacyLossDistribution | None]:
        with self._guard:
            hit = self._items.get(key)
            if hit is None:
                return False, None
            self._items.move_to_end(key)
            return True, hit[0]

    def put(self, key: tuple, pld: PrivacyLossDistribution | None) -> None:
        size = _nbytes(pld)
        with self._guard:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (pld, size)
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._guard:
            self._items.clear()
            self._bytes = 0


def _nbytes(pld: PrivacyLossDistribution | None) -> int:
    if pld is None:
        return 64
    total = 0
    # pylint: disable=protected-access
    for pmf in (pld._pmf_remove, pld._pmf_add):
        if isinstance(pmf, pld_pmf.DensePLDPmf):
            probs = np.asarray(pmf._probs)
            # a view keeps its whole base array alive
            total += int(probs.base.nbytes if isinstance(probs.base, np.ndarray) else probs.nbytes)
        else:
            total += 64 * max(1, pmf.size)  # a property of the PMF
    return total + 256


_CACHE = _BlockCache(CACHE_BYTES)


def _leaf(event: PrivacyEvent | None, grid: HistoryGrid) -> PrivacyLossDistribution | None:
    if event is None:
        return None
    p = _prepared(event, grid.tail, grid.settings)
    pld = p.pld(grid.h, grid.tail)
    if p.compositions > 1:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            pld = self_compose(pld, p.compositions, grid.truncation)
    return pld


def _block(
    slots: tuple[PrivacyEvent | None, ...], grid: HistoryGrid
) -> PrivacyLossDistribution | None:
    key = (slots, grid)
    found, pld = _CACHE.get(key)
    if found:
        return pld
    if len(slots) == 1:
        pld = _leaf(slots[0], grid)
    else:
        m = 1 << ((len(slots) - 1).bit_length() - 1)  # the largest power of two < len(slots)
        left, right = _block(slots[:m], grid), _block(slots[m:], grid)
        if left is None or right is None:
            pld = left if right is None else right
        else:
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                pld = compose(left, right, grid.truncation)
    _CACHE.put(key, pld)
    return pld


def epsilon_for_history(
    slots: Sequence[PrivacyEvent | None],
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> float:
    """Upper bound on ε at ``delta`` for the composition of the events in ``slots`` (``None``
    slots are empty), computed incrementally across calls: keep each event in its slot from
    one call to the next (e.g. a job's position on its data set) and only the blocks that
    changed are recomposed. 0 for a history without events."""
    delta = check_delta(delta)
    present = [e for e in slots if e is not None]
    if not present:
        return 0.0
    check_supported(present)
    if len(present) == 1 or gaussian_composition_mu(present) is not None:
        # a single event as calibrated; ν-DP-FTRL runs alone compose analytically
        return epsilon_for_events(present, delta, settings)
    grid = history_grid(present, delta, settings)
    pld = _block(_without_trailing_empty(slots), grid)
    assert pld is not None
    return epsilon_from_pld(pld, delta)


def _without_trailing_empty(
    slots: Sequence[PrivacyEvent | None],
) -> tuple[PrivacyEvent | None, ...]:
    """``slots`` without its trailing empty slots: the same composition, step for step (an
    empty block is skipped; the blocks of [0, n) with empty slots after n compose the same
    blocks in the same order as [0, n) itself — each split point either lies below n, where
    both recursions split alike, or at or above it, where the right part is all empty), so the
    same PLD, found in the cache under one key (a data set's spent events end in one empty
    slot per job that has not run yet: each new job would otherwise recompose them)."""
    end = len(slots)
    while end and slots[end - 1] is None:
        end -= 1
    return tuple(slots[:end])


def build_leaves(
    slots: Sequence[PrivacyEvent | None],
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> None:
    """Build and cache the leaves of the history ``slots`` (each event's PLD on the history's
    grid) and compose no block: the costly part of a later :func:`epsilon_for_history` of the
    same events — or of a history that differs by events in other slots, as long as the grid
    stays — done ahead of it (a job being created builds its own leaf before it takes its
    data set's turn, while other jobs commit and change the blocks)."""
    found = _leaf_grid(slots, delta, settings)
    if found is not None:
        for event in dict.fromkeys(found[0]):
            _block((event,), found[2])


def _leaf_grid(
    slots: Sequence[PrivacyEvent | None], delta: float, settings: AccountingSettings
) -> tuple[tuple[PrivacyEvent, ...], float, HistoryGrid] | None:
    """The history's events, δ and grid, or None when the history composes no leaf (a single
    event is accounted by ``epsilon_for_events``; Gaussian events alone, analytically)."""
    found = _leaf_events(slots, delta)
    if found is None:
        return None
    delta = check_delta(delta)
    return found, delta, history_grid(found, delta, settings)


def _leaf_events(
    slots: Sequence[PrivacyEvent | None], delta: float
) -> tuple[PrivacyEvent, ...] | None:
    """The history's events, or None when it composes no leaf (see :func:`_leaf_grid`)."""
    check_delta(delta)
    present = [e for e in slots if e is not None]
    if len(present) < 2:
        return None
    check_supported(present)
    if gaussian_composition_mu(present) is not None:
        return None
    return tuple(present)


_Step = tuple[StepMechanism, StepGeometry]


@dataclass(frozen=True)
class BuiltLeaves:
    """Leaves of a history built in one process, for another's caches (:func:`seed_leaves`):
    the history's events, δ, settings and grid, and for each event asked for its leaf and —
    for a Poisson-subsampled Gaussian event — its step at the grid's tail."""

    events: tuple[PrivacyEvent, ...]
    delta: float
    settings: AccountingSettings
    grid: HistoryGrid
    leaves: tuple[
        tuple[
            PrivacyEvent, PrivacyLossDistribution | None, tuple[StepMechanism, StepGeometry] | None
        ],
        ...,
    ]


def built_leaves(
    slots: Sequence[PrivacyEvent | None],
    delta: float,
    wanted: Sequence[PrivacyEvent],
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> BuiltLeaves | None:
    """Build the leaves of the history ``slots`` as :func:`build_leaves` does, and return the
    ``wanted`` events' leaves and every leaf this call had to build (not found in this
    process's cache: a grid that moved rebuilds them all), with what :func:`seed_leaves` needs
    to hand them to another process's caches; None when the history composes no leaf."""
    found = _leaf_grid(slots, delta, settings)
    if found is None:
        return None
    events, delta, grid = found
    wanted_set = set(wanted)
    leaves = []
    for event in dict.fromkeys(events):
        cached, _ = _CACHE.get(((event,), grid))
        if cached and event not in wanted_set:
            continue
        step = (
            step_of(event, grid.tail, settings)
            if isinstance(event, SubsampledGaussianEvent)
            else None
        )
        leaves.append((event, _block((event,), grid), step))
    return BuiltLeaves(events, delta, settings, grid, tuple(leaves))


def seed_leaves(built: BuiltLeaves) -> None:
    """Keep leaves built by :func:`built_leaves` (in another process: the same code on the same
    events, so the same grid and PLDs) in this process's caches: the history's grid, each
    event's step and its leaf, as if :func:`build_leaves` had run here. Soundness does not
    rest on their being equal to this process's: any grid gives an upper bound, and each leaf
    is a pessimistic PLD of its event on the grid it is keyed by."""
    key = (built.events, built.delta, built.settings)
    _SEEDED_GRIDS.put(key, built.grid)
    _TAILS.put((built.grid.tail, built.settings), True)
    for event, pld, step in built.leaves:
        if step is not None:
            assert isinstance(event, SubsampledGaussianEvent)
            seed_step(event, built.grid.tail, built.settings, step)
        _CACHE.put(((event,), built.grid), pld)


def clear_cache() -> None:
    """Forget every cached leaf, block and prepared event, and the Poisson-subsampled
    Gaussian's cached steps (tests, memory pressure)."""
    from dprc_core.accounting.subsampled_gaussian_builder import clear_step_cache

    clear_step_cache()
    _CACHE.clear()
    _prepared.cache_clear()
    _history_grid.cache_clear()
    _SEEDED_GRIDS.clear()
    _TAILS.clear()
