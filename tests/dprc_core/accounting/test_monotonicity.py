"""Test 3: monotonicity of ε, the k → ∞ limit, and noise_multiplier / epsilon round trips."""

from __future__ import annotations

import numpy as np
import pytest

from dprc_core import accounting

BASE = {"sample_rate": 0.01, "steps": 1000, "delta": 1e-5}
CLIPS = [("exact", None), ("hutch", 16), ("hutchpp", 32)]


def eps(sigma=1.0, sample_rate=0.01, steps=1000, delta=1e-5, clipping="exact", k=None, rank=None):
    return accounting.epsilon(sigma, sample_rate, steps, delta, clipping, k, rank)


@pytest.mark.parametrize("clipping,k", CLIPS)
def test_decreasing_in_sigma(clipping, k):
    values = [eps(sigma=s, clipping=clipping, k=k) for s in (0.7, 0.85, 1.0, 1.3, 2.0, 4.0)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False)), values


@pytest.mark.parametrize("clipping,k", CLIPS)
def test_increasing_in_sample_rate_and_steps(clipping, k):
    by_q = [eps(sample_rate=q, clipping=clipping, k=k) for q in (0.002, 0.005, 0.01, 0.03, 0.1)]
    assert all(a < b for a, b in zip(by_q, by_q[1:], strict=False)), by_q
    by_n = [eps(steps=n, clipping=clipping, k=k) for n in (1, 10, 100, 1000, 5000)]
    assert all(a < b for a, b in zip(by_n, by_n[1:], strict=False)), by_n


def test_decreasing_in_k_and_converging_to_exact():
    exact = eps()
    ks = [2, 4, 8, 32, 128, 512, 4096, 65536]
    values = [eps(clipping="hutch", k=k) for k in ks]
    assert all(a > b for a, b in zip(values, values[1:], strict=False)), values
    assert all(v > exact for v in values)  # randomized clipping never looks better than exact
    gaps = np.array(values) / exact - 1.0
    assert gaps[-1] < 0.01  # k = 65536: within 1% of exact (what is left is discretisation)
    assert gaps[-2] < 0.02


def test_rank_envelope_between_rank_one_and_dimension_free():
    """A larger total rank can only loosen the envelope; every rank is at most the
    dimension-free (rank=None) value."""
    free = eps(clipping="hutch", k=32)
    by_rank = [eps(clipping="hutch", k=32, rank=d) for d in (1, 2, 4, 8)]
    assert all(a <= b * (1 + 1e-3) for a, b in zip(by_rank, by_rank[1:], strict=False))
    assert all(v <= free * (1 + 1e-3) for v in by_rank)
    with pytest.raises(ValueError, match="rank applies to clipping='hutch' only"):
        eps(clipping="hutchpp", k=32, rank=4)  # it would be silently ignored


@pytest.mark.parametrize(
    "target,delta,q,steps,clipping,k",
    [
        (1.0, 1e-5, 0.01, 1000, "exact", None),
        (2.0, 1e-5, 32 / 1800, 171, "hutch", 32),
        (0.7, 1e-5, 32 / 1800, 171, "hutch", 8),
        (8.0, 1e-6, 0.05, 2000, "hutchpp", 64),
    ],
)
def test_noise_multiplier_round_trip(target, delta, q, steps, clipping, k):
    sigma = accounting.noise_multiplier(target, delta, q, steps, clipping, k)
    assert accounting.epsilon(sigma, q, steps, delta, clipping, k) <= target
    assert accounting.epsilon(sigma / 1.005, q, steps, delta, clipping, k) > target
    # and back: the ε of that σ, as a target, gives the same σ up to the tolerance
    achieved = accounting.epsilon(sigma, q, steps, delta, clipping, k)
    again = accounting.noise_multiplier(achieved, delta, q, steps, clipping, k)
    assert again == pytest.approx(sigma, rel=0.011)


def test_noise_multiplier_unreachable_target_is_a_clear_error():
    with pytest.raises(ValueError, match="no noise multiplier up to"):
        accounting.noise_multiplier(0.01, 1e-5, 1.0, 100_000)
