"""A create builds its own leaf of the file's history before the file's turn
(``service.budget.budget.build_leaf``), composing nothing else: the snapshot in the turn then builds
no leaf for it, and is the snapshot computed with every cache cleared — also when other jobs
committed in between. Counted, not timed."""

from __future__ import annotations

import random

import pytest

from dprc_core.accounting import SubsampledGaussianEvent
from dprc_core.accounting import history as hist
from dprc_core.accounting.history import clear_cache
from service.budget import budget

DELTA = 1.3e-3


def _older(n: int) -> tuple[SubsampledGaussianEvent, ...]:
    rng = random.Random(7)
    return tuple(
        SubsampledGaussianEvent(rng.uniform(2.0, 6.0), 0.05, rng.randint(1, 20)) for _ in range(n)
    )


@pytest.mark.parametrize("committed_meanwhile", [0, 2])
def test_built_leaf_serves_the_snapshot_in_the_turn(committed_meanwhile, monkeypatch):
    older = _older(12)
    new = SubsampledGaussianEvent(0.8, 0.05, 20, "hutch", 32, sketch="per_example")
    clear_cache()
    budget.build_leaf((older, older), DELTA, new)
    others = tuple(
        SubsampledGaussianEvent(0.9 + 0.01 * i, 0.05, 3, "hutch", 32, sketch="per_example")
        for i in range(committed_meanwhile)
    )
    events = (older + others, older + others)  # spent, committed: as the turn reads them
    built: list[object] = []
    real_leaf = hist._leaf

    def leaf(event, grid):
        built.append(event)
        return real_leaf(event, grid)

    monkeypatch.setattr(hist, "_leaf", leaf)
    in_turn = budget.snapshot(events, DELTA, new, 8.0)
    assert new not in built  # built before the turn
    monkeypatch.undo()
    clear_cache()
    assert in_turn == budget.snapshot(events, DELTA, new, 8.0)


def test_an_unbounded_event_is_left_to_the_snapshot():
    """What the accountant cannot bound is not an error before the turn: the snapshot says so
    (+inf, which fits no budget)."""
    older = _older(3)
    new = SubsampledGaussianEvent(0.3, 1.0, 1, "hutch", 2, sketch="per_example")
    budget.build_leaf((older, older), DELTA, new)  # no exception
    snap = budget.snapshot((older, older), DELTA, new, 8.0)
    assert snap is not None
    spent, committed = snap[1]
    assert committed == float("inf") and spent == budget.compose(list(older), DELTA)


@pytest.mark.parametrize("epsilon_budget", [100.0, 0.5])
def test_the_snapshot_warms_the_totals_without_the_job_only_for_a_refusal(
    epsilon_budget, monkeypatch
):
    """A job that fits needs only the totals with it; one that does not fit has the totals
    without it (the refusal's message, composed under the lock) composed in the snapshot."""
    older = _older(9)
    new = SubsampledGaussianEvent(0.8, 0.05, 20, "hutch", 32, sketch="per_example")
    events = (older[:-1] + (None,), older)  # spent, committed: the last job has not run yet
    clear_cache()
    with_job = budget.snapshot(events, DELTA, new, epsilon_budget)
    assert with_job is not None
    fits = with_job[1][1] <= epsilon_budget
    assert fits is (epsilon_budget == 100.0)
    composed: list[int] = []
    real_compose = hist.compose

    def compose(first, second, truncation):
        composed.append(1)
        return real_compose(first, second, truncation)

    monkeypatch.setattr(hist, "compose", compose)
    without = budget.totals(events, DELTA)  # what reserve() composes for a refusal's message
    assert bool(composed) is fits  # composed now only if the snapshot did not
    monkeypatch.undo()
    clear_cache()
    assert without == budget.totals(events, DELTA)


def test_a_snapshot_at_a_new_tail_has_its_leaves_built_in_the_accountant_process(monkeypatch):
    """Jobs committed after a create's leaf can push the history's total steps past a power of
    4: a new tail, a new grid, every leaf built again. With an accountant process the snapshot
    has them built there (the process's next leaf of the file needs them anyway): this process
    prepares no step and builds no leaf, and the totals are those composed here from scratch."""
    from dprc_core.accounting import subsampled_gaussian_builder as sgb
    from dprc_core.accounting.accountant_process import AccountantProcess

    older = tuple(
        SubsampledGaussianEvent(2.0 + 0.5 * i, 0.05, s) for i, s in enumerate([5, 10, 3, 7, 8, 7])
    )
    new = SubsampledGaussianEvent(0.8, 0.05, 20, "hutch", 32, sketch="per_example")
    others = tuple(
        SubsampledGaussianEvent(0.9 + 0.01 * i, 0.05, 5, "hutch", 32, sketch="per_example")
        for i in range(2)
    )
    events = ((None,) * 8, older + others)  # no job has run; committed: as the turn reads them
    process = AccountantProcess()
    try:
        clear_cache()
        budget.build_leaf(((None,) * 6, older), DELTA, new, process)  # 60 steps: tail of 64
        assert hist.tail_is_new([*older, *others, new], DELTA)  # 70 steps: tail of 256
        steps: list[object] = []
        leaves: list[object] = []
        real_step, real_leaf = sgb._one_step, hist._leaf
        monkeypatch.setattr(sgb, "_one_step", lambda *a: steps.append(a) or real_step(*a))
        monkeypatch.setattr(hist, "_leaf", lambda *a: leaves.append(a) or real_leaf(*a))
        in_turn = budget.snapshot(events, DELTA, new, 100.0, process)
        assert (steps, leaves) == ([], [])
        assert not hist.tail_is_new([*older, *others, new], DELTA)
    finally:
        process.close()
    monkeypatch.undo()
    clear_cache()
    assert in_turn == budget.snapshot(events, DELTA, new, 100.0)
