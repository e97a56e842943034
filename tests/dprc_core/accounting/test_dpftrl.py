"""ν-DP-FTRL sensitivity and Gaussian ε against independent references.

References: B built entry by entry from scipy's binomial, inverted densely with numpy, every
participation pattern enumerated; the elliptic integral K for the un-banded limit; and
dp_accounting's Gaussian privacy loss for δ(ε).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from scipy import special

from dprc_core.accounting import dpftrl
from dprc_core.accounting.dpftrl import (
    dpftrl_epsilon,
    dpftrl_noise_multiplier,
    dpftrl_sensitivity,
    dpftrl_sensitivity_details,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    inverse_coefficients,
    nu_dpftrl_coefficients,
    toeplitz_sensitivity,
)
from tests.dense_reference import dense_b


def patterns(steps: int, k: int, sep: int):
    for size in range(1, k + 1):
        for p in itertools.combinations(range(steps), size):
            if all(p[i + 1] - p[i] >= sep for i in range(size - 1)):
                yield p


def dense_sensitivity(inv: np.ndarray, k: int, sep: int) -> float:
    return max(
        float(np.linalg.norm(inv[:, list(p)].sum(axis=1))) for p in patterns(len(inv), k, sep)
    )


@pytest.mark.parametrize("nu", [0.0, 0.02, 0.3, 0.9])
@pytest.mark.parametrize("bands", [None, 4])
def test_coefficients_match_binomial_formula(nu, bands):
    beta = nu_dpftrl_coefficients(nu, 12, bands)
    ref = dense_b(nu, 12, bands)[:, 0]
    np.testing.assert_allclose(beta, ref, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("nu", [0.0, 0.01, 0.2, 0.6])
def test_unbanded_inverse_is_central_binomial_and_decreasing(nu):
    t = np.arange(40)
    inv = np.linalg.inv(dense_b(nu, 40, None))
    closed = special.comb(2 * t, t) / 4.0**t * (1 - nu) ** t
    np.testing.assert_allclose(inv[:, 0], closed, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(inverse_coefficients(nu, 40), closed, rtol=1e-12, atol=1e-15)
    assert np.all(closed >= 0) and np.all(np.diff(closed) <= 0)
    # Toeplitz: every column is the shifted first column
    for j in (3, 17):
        np.testing.assert_allclose(inv[j:, j], inv[: 40 - j, 0], rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("bands", [2, 3, 5, 16])
@pytest.mark.parametrize("nu", [0.0, 0.05, 0.5])
def test_banded_inverse_matches_dense_inverse(nu, bands):
    inv = np.linalg.inv(dense_b(nu, 30, bands))
    got = inverse_coefficients(nu, 30, bands)
    np.testing.assert_allclose(got, inv[:, 0], rtol=1e-9, atol=1e-13)
    assert np.all(inv >= -1e-15)  # non-negative: β_τ ≤ 0 for τ ≥ 1


CASES = [(12, 3, 4), (13, 2, 5), (10, 4, 2), (9, 9, 1), (11, 2, 3), (7, 1, 1)]


@pytest.mark.parametrize("nu", [0.0, 0.03, 0.4])
@pytest.mark.parametrize("bands", [None, 1, 2, 3, 6])
@pytest.mark.parametrize("steps,k,sep", CASES)
def test_sensitivity_matches_dense_enumeration(nu, bands, steps, k, sep):
    inv = np.linalg.inv(dense_b(nu, steps, bands))
    ref = dense_sensitivity(inv, k, sep)
    got = dpftrl_sensitivity_details(nu, steps, k, sep, bands)
    assert got.exact
    assert got.value >= ref  # never below the true value
    assert got.value == pytest.approx(ref, rel=1e-8)


def test_banding_changes_the_sensitivity_and_bands_1_is_independent_noise():
    # bands=1: B = I, each participation contributes an orthogonal unit column
    assert dpftrl_sensitivity(0.1, 50, 5, 10, bands=1) == pytest.approx(math.sqrt(5), rel=1e-8)
    full = dpftrl_sensitivity(0.05, 200, 4, 50)
    banded = dpftrl_sensitivity(0.05, 200, 4, 50, bands=8)
    assert abs(full - banded) > 1e-3 * full


def test_non_monotone_coefficients_use_exhaustive_search():
    c = np.array([1.0, 0.1, 0.8, 0.05, 0.6, 0.0, 0.7, 0.2, 0.1, 0.3])
    n = c.size
    inv = np.zeros((n, n))
    for j in range(n):
        inv[j:, j] = c[: n - j]
    for k, sep in [(2, 2), (3, 3), (4, 2), (2, 5)]:
        res = toeplitz_sensitivity(c, k, sep)
        ref = dense_sensitivity(inv, k, sep)
        assert res.method.startswith("exhaustive") and res.exact
        assert res.value == pytest.approx(ref, rel=1e-8)
        assert res.value >= ref
    # alternating coefficients: columns 0 and 2 overlap more than columns 0 and 1, so the
    # earliest pattern is not the maximiser (norm² 8 at {0, 1} against 13 at {0, 2})
    alt = np.array([1.0, 0.0] * 4)
    res = toeplitz_sensitivity(alt, 2, 1)
    assert res.earliest == pytest.approx(math.sqrt(8))
    assert res.value == pytest.approx(math.sqrt(13))


def test_negative_coefficients_are_bounded_for_vector_gradients():
    c = np.array([1.0, -0.7, 0.5, -0.2, 0.4, -0.3, 0.1, 0.05])
    n = c.size
    inv = np.zeros((n, n))
    for j in range(n):
        inv[j:, j] = c[: n - j]
    res = toeplitz_sensitivity(c, 3, 2)
    assert not res.exact
    # any signs (1-D gradients) and random directions (vector gradients) stay below the bound
    rng = np.random.default_rng(0)
    best = 0.0
    for p in patterns(n, 3, 2):
        for _ in range(20):
            u = rng.normal(size=(len(p), 5))
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            best = max(best, float(np.linalg.norm(inv[:, list(p)] @ u)))
        for signs in itertools.product((-1, 1), repeat=len(p)):
            best = max(best, float(np.linalg.norm(inv[:, list(p)] @ np.array(signs))))
    assert best <= res.value


def test_one_participation_is_always_the_first_column():
    c = np.array([1.0, 0.1, 0.8, -0.05, 0.6, 0.0, 0.7])
    inv = np.zeros((7, 7))
    for j in range(7):
        inv[j:, j] = c[: 7 - j]
    res = toeplitz_sensitivity(c, 1, 1)
    assert res.exact and res.value == pytest.approx(dense_sensitivity(inv, 1, 1), rel=1e-8)


def test_large_pattern_count_falls_back_to_a_sound_majorant(monkeypatch):
    c = np.array([1.0, 0.1, 0.8, 0.05, 0.6, 0.0, 0.7, 0.2, 0.1, 0.3, 0.2, 0.25])
    exact = toeplitz_sensitivity(c, 3, 2)
    monkeypatch.setattr(dpftrl, "MAX_EXHAUSTIVE_PATTERNS", 0)
    bound = toeplitz_sensitivity(c, 3, 2)
    assert bound.method.startswith("upper bound") and not bound.exact
    assert bound.value >= exact.value


def test_optimal_cc_sensitivity_diverges_like_log_t():
    # ν = 0 (Optimal CC), one participation: sens² = Σ_{t<T} c_t² with c_t² = 1/(πt)(1 + O(1/t)),
    # so sens²(T2) − sens²(T1) = ln(T2/T1)/π within 2/(π T1) (sum-vs-integral + the O(1/t) term).
    t1, t2 = 1000, 100_000
    diff = dpftrl_sensitivity(0.0, t2, 1, 1) ** 2 - dpftrl_sensitivity(0.0, t1, 1, 1) ** 2
    assert abs(diff - math.log(t2 / t1) / math.pi) < 2 / (math.pi * t1)
    # with damping it converges: Σ c_t² = (2/π) K(m = (1−ν)²) (complete elliptic integral)
    for nu in (0.3, 0.05, 0.01):
        limit = 2 / math.pi * special.ellipk((1 - nu) ** 2)
        assert dpftrl_sensitivity(nu, 4000, 1, 1) ** 2 == pytest.approx(limit, rel=1e-8)
    # ... and the limit itself diverges like ln(1/ν)/π as ν → 0 (K(m) ≈ ½ ln(16/(1−m)))
    k3 = 2 / math.pi * special.ellipk((1 - 1e-3) ** 2)
    k4 = 2 / math.pi * special.ellipk((1 - 1e-4) ** 2)
    assert k4 - k3 == pytest.approx(math.log(10) / math.pi, abs=2e-3)
    s4 = dpftrl_sensitivity(1e-4, 300_000, 1, 1) ** 2
    assert s4 == pytest.approx(k4, rel=1e-6)


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 3.0, 12.0])
def test_gaussian_delta_matches_dp_accounting(mu):
    loss = GaussianPrivacyLoss(standard_deviation=1.0, sensitivity=mu)
    for eps in (0.0, 0.1, 1.0, 5.0, mu * mu / 2 + 3 * mu):
        ref = loss.get_delta_for_epsilon(eps)
        assert gaussian_delta(eps, mu) == pytest.approx(ref, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("mu,delta", [(0.3, 1e-5), (1.0, 1e-6), (4.0, 1e-5), (1.0, 0.3)])
def test_gaussian_epsilon_inverts_delta_and_agrees_with_pld(mu, delta):
    eps = gaussian_epsilon(mu, delta)
    assert gaussian_delta(eps, mu) <= delta
    if eps > 0:
        assert gaussian_delta(eps * (1 - 1e-9), mu) > delta
    pld = pld_lib.from_gaussian_mechanism(
        1.0, sensitivity=mu, value_discretization_interval=1e-4, pessimistic_estimate=True
    )
    ref = pld.get_epsilon_for_delta(delta)
    assert ref >= eps * (1 - 1e-8)  # a pessimistic PLD is an upper bound
    assert ref == pytest.approx(eps, rel=1e-3, abs=1e-4)


def test_gaussian_mu_round_trip_and_validation():
    mu = gaussian_mu(2.0, 1e-5)
    assert gaussian_delta(2.0, mu) <= 1e-5 < gaussian_delta(2.0, mu * (1 + 1e-9))
    for bad in (0, -1, math.inf, math.nan, "2"):
        with pytest.raises(ValueError):
            gaussian_mu(bad, 1e-5)
    for bad in (0, 1, -0.1, math.nan):
        with pytest.raises(ValueError):
            gaussian_mu(2.0, bad)


def test_noise_multiplier_for_target_is_the_smallest():
    args = dict(nu=0.02, steps=300, participations=3, min_separation=100, bands=32)
    sigma = dpftrl_noise_multiplier(2.0, 1e-5, **args)
    assert dpftrl_epsilon(sigma, 1e-5, **args) <= 2.0
    assert dpftrl_epsilon(sigma * (1 - 1e-7), 1e-5, **args) > 2.0
    # independent: dense sensitivity and dp_accounting's Gaussian δ at that σ
    inv = np.linalg.inv(dense_b(0.02, 300, 32))
    sens = float(np.linalg.norm(inv[:, [0, 100, 200]].sum(axis=1)))
    d = GaussianPrivacyLoss(standard_deviation=sigma, sensitivity=sens).get_delta_for_epsilon(2.0)
    assert d == pytest.approx(1e-5, rel=1e-6)


def test_inputs_are_validated_and_randomized_clipping_refused():
    for kwargs in (
        dict(nu=-0.1),
        dict(nu=1.5),
        dict(nu=math.nan),
        dict(steps=0),
        dict(steps=2.5),
        dict(participations=0),
        dict(min_separation=0),
        dict(bands=0),
        dict(bands=2.0),
        dict(nu=True),
    ):
        args = dict(nu=0.1, steps=10, participations=1, min_separation=1) | kwargs
        with pytest.raises(ValueError):
            dpftrl_sensitivity(**args)
    with pytest.raises(ValueError, match="randomized clipping"):
        dpftrl_epsilon(1.0, 1e-5, 0.1, 10, 1, 10, envelope="hutch")
    with pytest.raises(ValueError, match="randomized clipping"):
        dpftrl_noise_multiplier(1.0, 1e-5, 0.1, 10, 1, 10, envelope="hutchpp")
    with pytest.raises(ValueError):
        dpftrl_epsilon(0.0, 1e-5, 0.1, 10, 1, 10)
