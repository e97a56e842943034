"""The incremental composition of a data set's history (dprc_core/accounting/history.py).

* Against Google dp_accounting: for exact-clipping histories its pessimistic PLDs of the
  Poisson-subsampled Gaussian, composed on a fine grid, are an independent near-exact value;
  ours, an upper bound, must not be below it by more than that reference's discretisation and
  not above it by more than 1%.
* Against a full composition (``epsilon_for_events``) for every clipping and mechanism: the
  two differ only by their discretisation, both upper bounds, within 0.1%.
* Incremental = from scratch: a value computed after a sequence of related histories equals,
  bit for bit, the value computed with every cache cleared.
* The work of one more job is O(log n) compositions, counted (not timed).
"""

from __future__ import annotations

import math
import random

import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting import PrivacyEvent, epsilon_for_events
from dprc_core.accounting import history as hist
from dprc_core.accounting.history import clear_cache, epsilon_for_history
from tests.call_counts import count_calls

DELTA = 1e-5


def _exact_history(rng: random.Random, n: int) -> list[PrivacyEvent]:
    return [
        PrivacyEvent(rng.uniform(0.7, 6.0), rng.choice([0.01, 0.05, 0.1]), rng.randint(1, 60))
        for _ in range(n)
    ]


def _dp_accounting_epsilon(events: list[PrivacyEvent], delta: float, h: float) -> float:
    total: PrivacyLossDistribution | None = None
    for e in events:
        pld = dpl.from_gaussian_mechanism(
            e.noise_multiplier,
            sampling_prob=e.sample_rate,
            value_discretization_interval=h,
            pessimistic_estimate=True,
        ).self_compose(e.steps)
        total = pld if total is None else total.compose(pld)
    assert total is not None
    return total.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_history_matches_dp_accounting(seed):
    events = _exact_history(random.Random(seed), 12)
    ours = epsilon_for_history(events, DELTA)
    coarse = _dp_accounting_epsilon(events, DELTA, 2e-4)
    fine = _dp_accounting_epsilon(events, DELTA, 1e-4)
    reference_error = abs(coarse - fine)  # its own discretisation error (∝ h²: ≥ the rest)
    assert ours >= fine - reference_error - 1e-9, (ours, fine, coarse)
    assert ours <= fine * 1.01, (ours, fine)


def _mixed_history(rng: random.Random, n: int) -> list[PrivacyEvent | None]:
    slots: list[PrivacyEvent | None] = []
    for _ in range(n):
        kind = rng.random()
        sigma, q, steps = rng.uniform(0.8, 5.0), rng.choice([0.02, 0.05]), rng.randint(1, 40)
        if kind < 0.1:
            slots.append(None)  # a job that has no event (yet)
        elif kind < 0.4:
            slots.append(PrivacyEvent(sigma, q, steps))
        elif kind < 0.6:
            slots.append(PrivacyEvent(sigma, q, steps, "hutch", rng.choice([16, 32])))
        elif kind < 0.75:
            slots.append(PrivacyEvent(sigma, q, steps, "hutchpp", 32))
        elif kind < 0.9:
            slots.append(PrivacyEvent(sigma, q, steps, "hutch", 32, sketch="per_example"))
        else:
            slots.append(PrivacyEvent.nu_dpftrl_prefix(sigma * 4, steps, 0.9, 10))
    return slots


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_history_matches_full_composition(seed):
    slots = _mixed_history(random.Random(100 + seed), 16)
    present = [e for e in slots if e is not None]
    ours = epsilon_for_history(slots, DELTA)
    full = epsilon_for_events(present, DELTA)
    assert math.isfinite(ours)
    assert abs(ours - full) <= 1e-3 * full, (ours, full)


def test_single_event_is_the_calibrated_value():
    event = PrivacyEvent(1.1, 0.05, 30, "hutch", 32)
    assert epsilon_for_history([None, event, None], DELTA) == epsilon_for_events([event], DELTA)
    assert epsilon_for_history([None, None], DELTA) == 0.0


def test_nu_dpftrl_runs_alone_compose_analytically():
    runs = [PrivacyEvent.nu_dpftrl_prefix(3.0, 20, 0.9, 10) for _ in range(2)]
    assert epsilon_for_history(runs, DELTA) == epsilon_for_events(runs, DELTA)


def test_incremental_equals_from_scratch():
    rng = random.Random(7)
    slots = _mixed_history(rng, 20)
    clear_cache()
    incremental = []
    for i in range(1, len(slots) + 1):  # jobs created one by one
        incremental.append(epsilon_for_history(slots[:i], DELTA))
    changed = list(slots)
    changed[3] = PrivacyEvent(2.0, 0.05, 5)  # a job ends early: its slot changes
    incremental.append(epsilon_for_history(changed, DELTA))
    checked = [4, 11, 19]  # histories recomputed from scratch (each costs a full composition)
    scratch = []
    for i in checked:
        clear_cache()
        scratch.append(epsilon_for_history(slots[: i + 1], DELTA))
    clear_cache()
    scratch.append(epsilon_for_history(changed, DELTA))
    assert [incremental[i] for i in checked] + [incremental[-1]] == scratch


def test_one_more_job_costs_log_n_compositions(monkeypatch):
    rng = random.Random(3)
    slots: list[PrivacyEvent | None] = list(_exact_history(rng, 64))
    clear_cache()
    epsilon_for_history(slots, DELTA)
    grid_before = hist.history_grid([e for e in slots if e is not None], DELTA)
    calls = count_calls(monkeypatch, hist, "compose", "_leaf")
    new = PrivacyEvent(1.3, 0.05, 2)  # short: the total steps stay in their bucket
    slots.append(new)
    assert hist.history_grid([e for e in slots if e is not None], DELTA) == grid_before
    epsilon_for_history(slots, DELTA)
    assert calls["_leaf"] == 1  # the new event's leaf only
    assert 1 <= calls["compose"] <= 2 * math.ceil(math.log2(len(slots))), calls
    calls.update(compose=0, _leaf=0)
    slots[10] = PrivacyEvent(1.3, 0.05, 1)  # one slot changes
    epsilon_for_history(slots, DELTA)
    assert calls["_leaf"] == 1
    assert calls["compose"] <= 2 * math.ceil(math.log2(len(slots))), calls


def test_built_leaves_serve_a_later_composition(monkeypatch):
    """build_leaves builds the new event's leaf ahead and composes nothing; the history then
    composed with other events committed meanwhile (in other slots, the grid unchanged)
    builds only those events' leaves and equals, bit for bit, the value from scratch."""
    rng = random.Random(11)
    slots: list[PrivacyEvent | None] = list(_exact_history(rng, 24))
    new = PrivacyEvent(0.8, 0.05, 3, "hutch", 32, sketch="per_example")
    clear_cache()
    epsilon_for_history(slots, DELTA)
    calls = count_calls(monkeypatch, hist, "compose", "_leaf")
    hist.build_leaves([*slots, new], DELTA)
    assert calls == {"compose": 0, "_leaf": 1}
    committed = PrivacyEvent(1.7, 0.05, 2)  # another job, committed meanwhile, before ours
    later = [*slots, committed, new]
    assert hist.history_grid([e for e in later if e is not None], DELTA) == hist.history_grid(
        [*slots, new], DELTA
    )
    calls.update(compose=0, _leaf=0)
    incremental = epsilon_for_history(later, DELTA)
    assert calls["_leaf"] == 1  # the committed job's; ours was built
    monkeypatch.undo()
    clear_cache()
    assert incremental == epsilon_for_history(later, DELTA)


def test_cache_is_bounded_by_bytes(monkeypatch):
    small = hist._BlockCache(max_bytes=1)
    monkeypatch.setattr(hist, "_CACHE", small)
    events = _exact_history(random.Random(5), 8)
    first = epsilon_for_history(events, DELTA)
    assert len(small._items) == 1  # everything but the newest evicted
    assert epsilon_for_history(events, DELTA) == first


def test_the_block_cache_sizes_sparse_plds():
    """A PLD whose PMFs are sparse (dp_accounting's identity, for one) is sized by its number
    of entries (``size`` is a property there): caching it does not raise."""
    from dp_accounting.pld.privacy_loss_distribution import identity

    from dprc_core.accounting import history

    sparse = identity()
    assert not isinstance(sparse._pmf_remove, history.pld_pmf.DensePLDPmf)
    assert history._nbytes(sparse) == 2 * 64 * max(1, sparse._pmf_remove.size) + 256
    cache = history._BlockCache(1 << 20)
    cache.put(("sparse",), sparse)
    assert cache.get(("sparse",)) == (True, sparse)


@pytest.mark.parametrize("n, empty", [(2, 3), (5, 1), (16, 1), (16, 17), (25, 7), (33, 31)])
def test_trailing_empty_slots_compose_alike_and_cost_nothing(monkeypatch, n, empty):
    """A data set's spent events end in an empty slot per job that has not run yet. Composed
    without the strip (the blocks of all ``n + empty`` slots, from an empty cache), they give
    the PLD of the ``n`` events bit for bit — the claim that lets ``epsilon_for_history`` drop
    them — and once the events are composed, more empty slots compose nothing."""
    rng = random.Random(n * 100 + empty)
    events: list[PrivacyEvent | None] = list(_exact_history(rng, n))
    if n > 2:
        events[n // 2] = None  # an empty slot inside stays where it is
    present = [e for e in events if e is not None]
    padded = events + [None] * empty
    clear_cache()
    grid = hist.history_grid(present, DELTA)
    unstripped = hist._block(tuple(padded), grid)
    clear_cache()
    reference = epsilon_for_history(events, DELTA)
    assert unstripped is not None
    assert hist.epsilon_from_pld(unstripped, DELTA) == reference
    calls = count_calls(monkeypatch, hist, "compose")
    assert epsilon_for_history(padded, DELTA) == reference
    assert calls["compose"] == 0
