"""Fixed-order batches for ν-DP-FTRL: once per epoch, exact separation, the accounted pattern
covers the real one, resume."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from scipy import special

from dprc_core.accounting import dpftrl_sensitivity
from dprc_core.training.sampling import FixedOrderSampler


def participation_steps(sampler: FixedOrderSampler) -> dict[int, list[int]]:
    steps = defaultdict(list)
    for t, batch in enumerate(sampler):
        for i in batch.tolist():
            steps[i].append(t)
    return steps


@pytest.mark.parametrize("n,b,epochs", [(12, 4, 3), (10, 4, 3), (7, 7, 2), (9, 2, 4), (5, 1, 2)])
def test_every_example_once_per_epoch_separated_by_steps_per_epoch(n, b, epochs):
    sampler = FixedOrderSampler(n, b, epochs=epochs, seed=3)
    spe = -(-n // b)
    assert sampler.steps_per_epoch == spe and len(sampler) == epochs * spe
    batches = [x.tolist() for x in FixedOrderSampler(n, b, epochs=epochs, seed=3)]
    for e in range(epochs):
        epoch = [i for batch in batches[e * spe : (e + 1) * spe] for i in batch]
        assert sorted(epoch) == list(range(n))  # each example exactly once
        assert batches[e * spe : (e + 1) * spe] == batches[:spe]  # same order every epoch
    sizes = [len(x) for x in batches[:spe]]
    assert sizes == [b] * (spe - 1) + [n - (spe - 1) * b]  # short last batch when B ∤ N
    steps = participation_steps(sampler)
    pattern = FixedOrderSampler(n, b, epochs=epochs, seed=3).accounting_pattern()
    assert pattern == {"steps": epochs * spe, "participations": epochs, "min_separation": spe}
    for ts in steps.values():
        assert len(ts) == epochs
        assert np.all(np.diff(ts) == spe)


@pytest.mark.parametrize("n,b,steps", [(10, 3, 9), (10, 3, 10), (8, 4, 5)])
def test_partial_epochs_and_the_sensitivity_covers_every_real_pattern(n, b, steps):
    sampler = FixedOrderSampler(n, b, steps=steps, seed=1)
    pattern = sampler.accounting_pattern()
    real = participation_steps(sampler)
    assert max(len(ts) for ts in real.values()) == pattern["participations"]
    for ts in real.values():
        assert all(d >= pattern["min_separation"] for d in np.diff(ts))
    # dense reference: B from the binomial formula, numpy inverse, each real pattern
    nu, bands = 0.1, 3
    t = steps
    bmat = np.zeros((t, t))
    for i in range(t):
        for j in range(max(0, i - bands + 1), i + 1):
            bmat[i, j] = (-1) ** (i - j) * special.binom(0.5, i - j) * (1 - nu) ** (i - j)
    inv = np.linalg.inv(bmat)
    worst = max(np.linalg.norm(inv[:, ts].sum(axis=1)) for ts in real.values())
    sens = dpftrl_sensitivity(nu, bands=bands, **pattern)
    assert worst <= sens
    assert worst == pytest.approx(sens, rel=1e-6)  # batch 0 is the earliest pattern


def test_seeded_order_is_deterministic_and_resumes():
    a = FixedOrderSampler(20, 6, epochs=2, seed=7)
    full = [x.tolist() for x in a]
    b = FixedOrderSampler(20, 6, epochs=2, seed=7)
    it = iter(b)
    head = [next(it).tolist() for _ in range(5)]
    state = json.loads(json.dumps(b.state_dict()))  # JSON-able
    c = FixedOrderSampler.from_state_dict(state)
    assert c.step == 5
    assert head + [x.tolist() for x in c] == full
    other = [x.tolist() for x in FixedOrderSampler(20, 6, epochs=2, seed=8)]
    assert other != full
    assert FixedOrderSampler(20, 6, epochs=1).seed != FixedOrderSampler(20, 6, epochs=1).seed


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((0, 1), dict(epochs=1)),
        ((5, 0), dict(epochs=1)),
        ((5, 6), dict(epochs=1)),
        ((5, 2), dict()),
        ((5, 2), dict(epochs=1, steps=3)),
        ((5, 2), dict(epochs=0)),
        ((5, 2), dict(steps=0)),
        ((5, 2), dict(epochs=1, seed=-1)),
    ],
)
def test_validation(args, kwargs):
    with pytest.raises(ValueError):
        FixedOrderSampler(*args, **kwargs)


def test_bad_state_is_refused():
    state = FixedOrderSampler(5, 2, epochs=1, seed=0).state_dict()
    with pytest.raises(ValueError):
        FixedOrderSampler.from_state_dict({k: v for k, v in state.items() if k != "seed"})
    with pytest.raises(ValueError):
        FixedOrderSampler.from_state_dict(state | {"step": 99})
