"""Poisson sampling and the end-to-end library demo."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dprc_core.accounting import PrivacyLedger
from dprc_core.training import PoissonSampler


def test_poisson_sampler_inclusion_is_independent_bernoulli():
    n, q, steps = 200, 0.05, 400
    batches = list(PoissonSampler(n, q, steps, seed=0))
    assert len(batches) == steps
    counts = torch.zeros(n)
    sizes = []
    for idx in batches:
        assert idx.unique().numel() == idx.numel() and (idx >= 0).all() and (idx < n).all()
        counts[idx] += 1
        sizes.append(idx.numel())
    total = n * steps
    # total inclusions ~ Binomial(n·steps, q): 6-sigma bound
    assert abs(counts.sum() - q * total) <= 6 * math.sqrt(total * q * (1 - q))
    # batch sizes vary (Binomial(n, q)), empty batches included with P = 0.95^200 ≈ 3.5e-5
    assert len(set(sizes)) > 5
    sampler = PoissonSampler(3, 0.01, 2000, seed=1)
    empties = sum(1 for idx in sampler if idx.numel() == 0)
    # P(empty) = 0.99³ ≈ 0.9703; Binomial(2000, 0.9703) 6-sigma bound
    p = 0.99**3
    assert abs(empties - 2000 * p) <= 6 * math.sqrt(2000 * p * (1 - p))


@pytest.mark.parametrize(
    "args", [(0, 0.1, 1), (10, 0.0, 1), (10, 1.5, 1), (10, 0.1, 0), (10.5, 0.1, 1)]
)
def test_poisson_sampler_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        PoissonSampler(*args)


def test_demo_runs_and_stays_within_budget(tmp_path):
    from safetensors.torch import load_file

    from dprc_core.training.demo import run

    summary = run(tmp_path, epsilon=4.0, epochs=1)
    assert summary["epsilon_spent"] <= 4.0
    ledger = PrivacyLedger.from_json((tmp_path / "privacy_ledger.json").read_text())
    # δ is the 1/N^1.1 rule of every other entry point (N = 512 examples): 1.0e-3 rounded down
    assert summary["delta"] == pytest.approx(1.0e-3) and summary["delta"] <= 512**-1.1
    assert ledger.epsilon(summary["delta"]) == pytest.approx(summary["epsilon_spent"])
    assert [e.clipping for e in ledger.events] == ["hutch"]
    weights = load_file(tmp_path / "checkpoint" / "model.safetensors")
    base = load_file(tmp_path / "base-model" / "model.safetensors")
    changed = [k for k in base if not torch.equal(base[k], weights[k])]
    assert changed, "training must have updated the weights"
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.pt"))
    json.dumps(summary)


def test_inclusion_probability_never_exceeds_the_accounted_rate():
    """The drawn rate ⌊q·2⁵³⌋/2⁵³ is the probability that a float64 uniform k·2⁻⁵³ falls below
    it (counted exactly over the 2⁵³ values): ≤ q — where float32 coins (k·2⁻²⁴) would give
    ⌈q·2²⁴⌉/2²⁴ > q. (The geometric skips draw exactly this rate: test_geometric_skips.py.)"""
    import math
    from fractions import Fraction

    from dprc_core.training.sampling import inclusion_threshold

    for q in (64 / 10**7, 1 / 3, 0.05, 1e-9, 2.0**-20, 0.999999):
        t = inclusion_threshold(q)
        coins_below = math.ceil(Fraction(t) * 2**53)  # k with k·2⁻⁵³ < t
        assert Fraction(coins_below, 2**53) <= Fraction(q)
        assert Fraction(q) - Fraction(coins_below, 2**53) < Fraction(1, 2**53)
        float32_rate = Fraction(math.ceil(Fraction(q) * 2**24), 2**24)
        if Fraction(q) * 2**24 != int(Fraction(q) * 2**24):
            assert float32_rate > Fraction(q)  # what the float32 coins would have run


def test_poisson_indices_rate_and_order():
    from dprc_core.training import sampling

    g = torch.Generator().manual_seed(0)
    counts = [len(sampling.poisson_indices(25_000, 0.01, g)) for _ in range(200)]
    mean = sum(counts) / len(counts)
    assert abs(mean - 250) < 4 * (250 * 0.99 / 200) ** 0.5
    idx = sampling.poisson_indices(25_000, 0.5, g)
    assert idx.min() >= 0 and idx.max() < 25_000 and torch.all(idx[1:] > idx[:-1])
