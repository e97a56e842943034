"""Soundness of the building blocks: hockey-stick formulas, dominating scales, connect-the-dots.

References are independent: Google's ``dp_accounting`` privacy-loss classes for the Gaussian
profiles, scipy quadrature of the envelope density for the random-scale mixture.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss
from scipy import integrate, stats

from dprc_core.accounting.envelope import chi2_mean_cdf, scale_tail
from dprc_core.accounting.hockey_stick import (
    delta_infinite_sensitivity,
    delta_subsampled,
    lower_tail,
)
from dprc_core.accounting.pld_epsilon import epsilon_from_pld
from dprc_core.accounting.random_scale_pld import (
    StepMechanism,
    mixture_delta,
    step_geometry,
    step_pld,
)
from dprc_core.accounting.scale_distribution import envelope_scale, exact_scale

ADJ = {"remove": AdjacencyType.REMOVE, "add": AdjacencyType.ADD}
EPS = np.concatenate([np.linspace(-4, 8, 97), [15.0, 40.0, 120.0]])


@pytest.mark.parametrize(
    "sigma,a,q",
    [
        (1.0, 1.0, 1e-3),
        (0.5, 1.3, 0.5),
        (3.0, 0.7, 0.01),
        (2.0, 1.0, 1.0),
        (0.8, 5.0, 0.2),
        (0.1, 3.0, 0.3),
        (0.2, 3.0, 0.999),
        (10.0, 1.0, 1e-4),
    ],
)
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_hockey_stick_matches_dp_accounting(sigma, a, q, direction):
    ref = GaussianPrivacyLoss(
        sigma, sensitivity=a, sampling_prob=q, adjacency_type=ADJ[direction]
    ).get_delta_for_epsilon(EPS)
    ours = delta_subsampled(EPS, np.array([a / sigma]), q, direction)[0]
    assert np.all(np.isfinite(ours))
    assert np.max(np.abs(ours - ref)) < 1e-14
    big = ref > 1e-250
    assert np.max(np.abs(ours[big] - ref[big]) / ref[big]) < 1e-9


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("q", [1e-3, 0.3, 1.0])
def test_profile_monotone_in_scale_and_limit(direction, q):
    s = np.geomspace(0.05, 60.0, 200)
    d = delta_subsampled(EPS, s, q, direction)
    assert np.all(np.diff(d, axis=0) >= -1e-15), "larger sensitivity must dominate"
    assert np.all(np.diff(d, axis=1) <= 1e-15), "profile is non-increasing in epsilon"
    limit = delta_infinite_sensitivity(EPS, q, direction)
    assert np.all(d <= limit + 1e-12)


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_lower_tail_matches_monte_carlo(direction):
    rng = np.random.default_rng(7)
    s, q, n = 1.3, 0.2, 400_000
    x0 = rng.standard_normal(n)
    if direction == "remove":
        x = x0 + np.where(rng.random(n) < q, s, 0.0)
        loss = np.log(1 - q + q * np.exp(s * x - s * s / 2))
    else:
        loss = -np.log(1 - q + q * np.exp(s * x0 - s * s / 2))
    t = np.array([-1.0, -0.2, 0.0, 0.1, 0.5, 1.0])
    emp = np.array([(loss < v).mean() for v in t])
    dkw = np.sqrt(np.log(2 / 1e-6) / (2 * n))
    assert np.max(np.abs(lower_tail(t, np.array([s]), q, direction)[0] - emp)) < dkw


@pytest.mark.parametrize("k,rank", [(8, None), (32, None), (8, 1), (16, 3)])
def test_scale_distribution_dominates_envelope(k, rank):
    """P(Ã > a) ≥ T(a) ≥ P(a_true > a) for every a (upper-edge rounding)."""
    dist = envelope_scale(k, rank, inf_budget=1e-12, relative_width=0.01)
    a = np.geomspace(0.2, dist.values[-1] * 1.5, 4000)
    survival = np.array([dist.weights[dist.values > v].sum() for v in a]) + dist.inf_weight
    assert np.all(survival >= scale_tail(a, k, rank) - 1e-12)
    assert abs(dist.total - 1.0) < 1e-9


def _true_mixture_delta(eps, sigma, q, k, direction):
    """∫ δ(ε; a/σ) dP(a) for the dimension-free envelope by scipy quadrature over Y."""
    atom = 1.0 - float(chi2_mean_cdf(1.0, k))
    dens = stats.chi2(k, scale=1.0 / k).pdf
    out = []
    for e in eps:
        base = atom * delta_subsampled([e], [1.0 / sigma], q, direction)[0, 0]

        def integrand(y, e=e):
            return dens(y) * delta_subsampled([e], [1.0 / np.sqrt(y) / sigma], q, direction)[0, 0]

        val, _ = integrate.quad(integrand, 1e-12, 1.0, limit=400, epsabs=1e-14, epsrel=1e-10)
        out.append(base + val)
    return np.array(out)


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_mixture_profile_is_an_upper_bound(direction):
    sigma, q, k = 0.9, 0.05, 16
    mech = StepMechanism(sigma, q, envelope_scale(k, None, 1e-14))
    eps = np.linspace(-0.3, 1.5, 13)
    ours = mixture_delta(eps, mech, direction)
    true = _true_mixture_delta(eps, sigma, q, k, direction)
    assert np.all(ours >= true - 1e-13)
    # and tight: upper-edge rounding of 0.1%-wide scale bins
    assert np.all(ours <= true * 1.02 + 1e-12)


def _discrete_profile(pmf, eps):
    # pylint: disable=protected-access
    losses = (pmf._lower_loss + np.arange(pmf.size)) * pmf._discretization
    probs = pmf._probs
    return np.array(
        [
            pmf._infinity_mass + np.sum(probs[losses > e] * -np.expm1(e - losses[losses > e]))
            for e in eps
        ]
    )


@pytest.mark.parametrize("clipping", ["exact", "hutch"])
@pytest.mark.parametrize("sparse", [True, False])
def test_connect_the_dots_pld_dominates_everywhere(clipping, sparse):
    """The discrete per-step PLD's profile is above the true one on and off the grid."""
    sigma, q, tail = 1.2, 0.02, 1e-12
    scale = (
        exact_scale()
        if clipping == "exact"
        else envelope_scale(8, None, tail / (4 * q), relative_width=0.02, a_cap=12.0)
    )
    mech = StepMechanism(sigma, q, scale)
    h = 3e-3
    pld = step_pld(mech, h, tail, step_geometry(mech, tail), sparse=sparse)
    eps = np.random.default_rng(3).uniform(-0.5, 3.0, 300)  # off-grid points
    for direction, pmf in (("remove", pld._pmf_remove), ("add", pld._pmf_add)):
        disc = _discrete_profile(pmf, eps)
        true = mixture_delta(eps, mech, direction)
        assert np.all(disc >= true - 1e-12), direction


@pytest.mark.parametrize("sigma,q,n,delta", [(1.0, 1e-3, 5000, 1e-6), (0.6, 0.05, 300, 1e-5)])
def test_vectorised_epsilon_matches_dp_accounting(sigma, q, n, delta):
    pld = dpl.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=1e-4)
    composed = pld.self_compose(n)
    assert epsilon_from_pld(composed, delta) == pytest.approx(
        composed.get_epsilon_for_delta(delta), rel=1e-6, abs=1e-12
    )
