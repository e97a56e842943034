"""Test 2: the envelope is an envelope, the total rank D is the right dimension, and x₊.

Monte-Carlo: Y = Σ λ_i χ²_i(k)/k (‖λ‖₁ = 1), or with an exactly computed part
Y = α + (1 − α) Σ β_i χ²_i(k)/k (Hutch++ head / exact layers). With n samples the empirical CDF
is within ε_DKW = sqrt(log(2/p)/(2n)) of the true CDF everywhere with probability ≥ 1 − p
(Dvoretzky–Kiefer–Wolfowitz, Massart's constant), p = 1e-6 per spectrum, fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest

from dprc_core.accounting import envelope_cdf, x_plus
from dprc_core.accounting.envelope import (
    RANK_ENVELOPE_MAX,
    _sup_two_component,
    chi2_mean_cdf,
    two_component_cdf,
)

P_FAIL = 1e-6
N_MC = 200_000


def dkw(n: int, p: float = P_FAIL) -> float:
    return float(np.sqrt(np.log(2.0 / p) / (2.0 * n)))


def sample_y(rng, lam, k, n, alpha=0.0):
    lam = np.asarray(lam, dtype=np.float64)
    lam = lam / lam.sum()
    chi = rng.chisquare(k, size=(n, lam.size)) / k
    return alpha + (1.0 - alpha) * chi @ lam


def max_excess(y, k, rank, xs):
    """max_x (ECDF(x) − envelope(x)) over the grid xs."""
    ys = np.sort(y)
    ecdf = np.searchsorted(ys, xs, side="right") / ys.size
    return float(np.max(ecdf - envelope_cdf(xs, k, rank)))


def spectra(d, rng):
    out = {"vertex": np.eye(d)[0], "uniform": np.ones(d)}
    if d >= 2:
        out["two-point"] = np.r_[0.7, 0.3, np.zeros(d - 2)]
        out["one-big"] = np.r_[0.45, np.full(d - 1, 0.55 / (d - 1))]
    for a in (0.3, 1.0, 5.0):
        out[f"dirichlet{a}"] = rng.dirichlet(np.full(d, a))
    return out


X_GRID = np.concatenate(
    [np.linspace(0.05, 0.999, 60), np.linspace(1.0, 1.6, 61), np.linspace(1.65, 4.0, 20)]
)


@pytest.mark.parametrize("k", [2, 8, 32])
@pytest.mark.parametrize("d", [1, 3, 12])
@pytest.mark.parametrize("alpha", [0.0, 0.4, 0.8])
def test_dimension_free_envelope_dominates(k, d, alpha):
    rng = np.random.default_rng(1000 * k + 10 * d + int(10 * alpha))
    for name, lam in spectra(d, rng).items():
        y = sample_y(rng, lam, k, N_MC, alpha)
        excess = max_excess(y, k, None, X_GRID)
        assert excess <= dkw(N_MC), f"{name}: ECDF exceeds the envelope by {excess:.4f}"


@pytest.mark.parametrize("k,rank", [(4, 2), (8, 3), (8, 4), (32, 4), (16, 8)])
def test_rank_envelope_dominates_spectra_of_that_rank(k, rank):
    rng = np.random.default_rng(17 * k + rank)
    xp = x_plus(k, rank)
    # dense around the middle region (1, x₊) where the two-component supremum is used
    xs = np.concatenate(
        [
            np.linspace(0.3, 0.99, 20),
            np.linspace(1.0, xp, 9)[1:],
            np.linspace(xp * 1.001, 1.0 + 6 * (xp - 1), 12),
            [1.5, 2.0, 3.0],
        ]
    )
    for name, lam in spectra(rank, rng).items():
        assert np.count_nonzero(lam) <= rank
        y = sample_y(rng, lam, k, N_MC)
        excess = max_excess(y, k, rank, xs)
        assert excess <= dkw(N_MC), f"{name}: ECDF exceeds the rank-{rank} envelope"


def test_two_rank_one_layers_need_total_rank():
    """Two randomized layers with min(p, d) = 1 each: λ = (½, ½). max_l min(p_l, d_l) = 1
    would select the d = 1 envelope, which this spectrum beats for x > 1; D = Σ = 2 covers it."""
    k, n = 8, N_MC
    rng = np.random.default_rng(2024)
    # independent projections per layer: each layer contributes its own χ²(k)/k
    y = 0.5 * rng.chisquare(k, n) / k + 0.5 * rng.chisquare(k, n) / k
    xs = np.linspace(1.0, 2.0, 101)
    ys = np.sort(y)
    ecdf = np.searchsorted(ys, xs, side="right") / n
    violation = ecdf - envelope_cdf(xs, k, rank=1)
    assert violation.max() > dkw(n), "the d=1 envelope should be violated for some x > 1"
    assert xs[np.argmax(violation)] > 1.0
    assert (ecdf - envelope_cdf(xs, k, rank=2)).max() <= dkw(n)
    assert (ecdf - envelope_cdf(xs, k, rank=None)).max() <= dkw(n)


def test_envelope_shape():
    x = np.linspace(0.0, 3.0, 301)
    for k in (2, 8, 64):
        free = envelope_cdf(x, k)
        assert np.all(np.diff(free) >= 0)
        assert np.allclose(free[x < 1], chi2_mean_cdf(x[x < 1], k))
        assert np.all(free[x >= 1] == 1.0)
        assert np.allclose(envelope_cdf(x, k, rank=1), chi2_mean_cdf(x, k))
        for rank in (2, 5):
            env = envelope_cdf(x, k, rank)
            assert np.all(np.diff(env) >= -1e-12)
            assert np.all(env >= chi2_mean_cdf(x, k) - 1e-12)
            assert np.all(env >= chi2_mean_cdf(x, rank * k) - 1e-12)
            assert np.all(env <= free + 1e-12)
    # above the cap the dimension-free envelope (valid for every D) is used
    assert np.array_equal(envelope_cdf(x, 8, RANK_ENVELOPE_MAX + 1), envelope_cdf(x, 8))


def test_two_component_cdf_matches_monte_carlo():
    rng = np.random.default_rng(5)
    n = 400_000
    for k, i, j, lam, x in [
        (8, 1, 1, 0.3, 1.1),
        (8, 2, 3, 0.1, 1.05),
        (4, 1, 5, 0.5, 0.9),
        (32, 3, 1, 0.02, 1.02),
        (8, 7, 1, 1 / 64, 1.0),
    ]:
        y = lam / (i * k) * rng.chisquare(i * k, n) + (1 - lam) / (j * k) * rng.chisquare(j * k, n)
        assert abs(two_component_cdf(x, k, i, j, lam)[()] - (y <= x).mean()) < dkw(n)
    # λ = 1/2 with i = j is the uniform spectrum over 2i components
    assert two_component_cdf(1.07, 8, 3, 3, 0.5)[()] == pytest.approx(
        float(chi2_mean_cdf(1.07, 48)), abs=1e-12
    )


@pytest.mark.parametrize("k", [8, 64, 512])
def test_x_plus_matches_paper_fit_for_d2(k):
    """Figure 7 fit x₊ = 1 + 2/(dk): holds for d = 2 (relative error of x₊ − 1 below 0.1%)."""
    xp = x_plus(k, 2)
    assert (xp - 1.0) * 2 * k / 2.0 == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("rank", [3, 4, 8])
def test_x_plus_scales_as_one_over_dk_with_rank_constant(rank):
    """x₊ − 1 = 2 c(D)/(Dk): the 1/(Dk) scaling holds (the constant does not move from k = 64
    to k = 512 by more than 0.2%), but c(D) > 1 for D ≥ 3, i.e. the paper's fit is low."""
    c = [(x_plus(k, rank) - 1.0) * rank * k / 2.0 for k in (64, 512)]
    assert c[0] == pytest.approx(c[1], rel=2e-3)
    assert c[1] > 1.03


def test_paper_threshold_is_not_an_envelope_for_d4():
    """At x = 1 + 2/(Dk) (the paper's x₊ for D = 4, k = 8) a 4-component spectrum has a larger
    CDF than the uniform one: shown by a correlated Monte-Carlo (same χ² draws), z > 4.75."""
    k, rank = 8, 4
    x = 1.0 + 2.0 / (rank * k)
    _, (i, j, lam) = _sup_two_component(x, k, rank)
    weights = np.r_[np.full(int(i), lam / i), np.full(int(j), (1 - lam) / j)]
    assert weights.size == rank
    rng = np.random.default_rng(99)
    diffs = []
    for _ in range(10):
        chi = rng.chisquare(k, size=(400_000, rank)) / k
        diffs.append((chi @ weights <= x).astype(float) - (chi.mean(axis=1) <= x))
    diff = np.concatenate(diffs)
    z = diff.mean() / (diff.std(ddof=1) / np.sqrt(diff.size))
    assert z > 4.75, f"mean difference {diff.mean():.2e}, z = {z:.2f}"
    assert x_plus(k, rank) > x
