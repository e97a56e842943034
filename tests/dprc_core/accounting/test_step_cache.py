"""The per-process caches of the accountant (issue 45, busy creates) change no number:

* one step's mechanism and loss geometry are cached by the step (``_one_step``, not the step
  count): a prepared event is field for field the one computed without the cache, and ε's of
  events that share a step are bit for bit those computed with every cache cleared;
* a history's grid is cached by its events (``history._history_grid``): equal to the grid
  computed without the cache;
* the bisection tree's midpoints are those of the former ``column_stack`` construction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dprc_core.accounting import SubsampledGaussianEvent, epsilon_for_events
from dprc_core.accounting import history as hist
from dprc_core.accounting import subsampled_gaussian_builder as sgb
from dprc_core.accounting.accountant import DEFAULT_SETTINGS, prepare
from dprc_core.accounting.random_scale_pld import _bisection_tree

DELTA = 1e-5
STEPS = [
    SubsampledGaussianEvent(1.3, 0.05, 20),
    SubsampledGaussianEvent(1.0, 0.02, 50, "hutch", 32),
    SubsampledGaussianEvent(0.9, 0.05, 20, "hutch", 32, sketch="per_example"),
]


def _clear() -> None:
    hist.clear_cache()  # the step cache too
    assert sgb._one_step.cache_info().currsize == 0


def _same_geometry(a, b) -> None:
    for field in ("lims", "bulk", "mean", "std"):
        assert getattr(a, field) == getattr(b, field)


@pytest.mark.parametrize("event", STEPS, ids=["exact", "hutch", "per_example"])
def test_prepared_event_is_the_uncached_one(event):
    _clear()
    tail = 1e-3 * DELTA / 64
    prepare(event.first_steps(3), tail, DEFAULT_SETTINGS)  # warms the step's cache entry
    cached = prepare(event, tail, DEFAULT_SETTINGS)
    fresh_mech, fresh_geometry = sgb._one_step.__wrapped__(
        dataclasses.replace(event, steps=1), tail, DEFAULT_SETTINGS
    )
    assert cached.event == event
    assert cached.mech.sigma == fresh_mech.sigma and cached.mech.q == fresh_mech.q
    np.testing.assert_array_equal(cached.mech.scale.values, fresh_mech.scale.values)
    np.testing.assert_array_equal(cached.mech.scale.weights, fresh_mech.scale.weights)
    assert cached.mech.scale.inf_weight == fresh_mech.scale.inf_weight
    _same_geometry(cached.geometry, fresh_geometry)


@pytest.mark.parametrize("event", STEPS, ids=["exact", "hutch", "per_example"])
def test_epsilons_with_shared_steps_are_those_from_scratch(event):
    runs = [event.first_steps(n) for n in (1, 7, event.steps)]
    _clear()
    warm = [epsilon_for_events([e], DELTA) for e in runs]
    history_warm = hist.epsilon_for_history([*runs, STEPS[0]], DELTA)
    scratch = []
    for e in runs:
        _clear()
        scratch.append(epsilon_for_events([e], DELTA))
    _clear()
    assert warm == scratch
    assert history_warm == hist.epsilon_for_history([*runs, STEPS[0]], DELTA)


def test_history_grid_is_the_uncached_one():
    events = [STEPS[0], STEPS[1].first_steps(5), STEPS[2]]
    _clear()
    cached = hist.history_grid(events, DELTA)
    assert hist.history_grid(list(events), DELTA) is cached
    assert cached == hist._history_grid.__wrapped__(tuple(events), DELTA, DEFAULT_SETTINGS)


def _former_tree(lo: float, hi: float, levels: int) -> np.ndarray:
    a, b = np.array([lo]), np.array([hi])
    out = []
    for _ in range(levels):
        mid = 0.5 * (a + b)
        out.append(mid)
        a = np.column_stack([a, mid]).ravel()
        b = np.column_stack([mid, b]).ravel()
    return np.concatenate(out)


@pytest.mark.parametrize("lo,hi,levels", [(-3.0, 7.5, 8), (1e-9, 1e4, 5), (-1e4, -1e-9, 1)])
def test_bisection_tree_is_the_former_one(lo, hi, levels):
    np.testing.assert_array_equal(_bisection_tree(lo, hi, levels), _former_tree(lo, hi, levels))
