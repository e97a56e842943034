"""The one-run privacy audit (dprc_core.auditing): the bound against independent arithmetic,
its coverage on a mechanism whose ε is known exactly, and a white-box audit of the real engine
(lower bound ≤ accounted ε) and of a deliberately broken one (lower bound > claimed ε).

The broken engine lives here only: it is never reachable from the library's API.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from dprc_core import Clipping, Exact, Gaussian, Hutch, HutchPP, PrivacyEngine, accounting
from dprc_core.auditing import (
    audit_scores,
    epsilon_lower_bound,
    p_value,
    run_gradient_canary_audit,
)
from dprc_core.noise import GaussianNoise


def _binom_sf_exact(v: int, r: int, p: Fraction) -> Fraction:
    return sum((math.comb(r, j) * p**j * (1 - p) ** (r - j) for j in range(v, r + 1)), Fraction(0))


@pytest.mark.parametrize("r,v", [(10, 7), (50, 40), (100, 100), (30, 0)])
def test_p_value_pure_dp_is_the_exact_binomial_tail(r, v):
    eps = 0.7
    # p = e^ε/(1+e^ε) in exact rational arithmetic from a float e^ε: isolates the tail sum
    e = Fraction(math.exp(eps))
    expected = _binom_sf_exact(v, r, e / (1 + e))
    assert p_value(200, r, v, eps, 0.0) == pytest.approx(float(expected), rel=1e-9, abs=1e-300)


def test_p_value_delta_term_matches_the_theorem_formula():
    m, r, v, eps, delta = 400, 60, 45, 1.1, 1e-4
    e = Fraction(math.exp(eps))
    p = e / (1 + e)

    def pmf(j):
        return math.comb(r, j) * p**j * (1 - p) ** (r - j)

    alpha = max(sum((pmf(j) for j in range(v - i, v)), Fraction(0)) / i for i in range(1, v + 1))
    expected = _binom_sf_exact(v, r, p) + 2 * m * Fraction(delta) * alpha
    assert p_value(m, r, v, eps, delta) == pytest.approx(float(min(expected, 1)), rel=1e-9)


def test_lower_bound_sits_on_the_rejection_boundary():
    m, r, v, delta = 1000, 200, 180, 1e-5
    lb = epsilon_lower_bound(m, r, v, delta, 0.95)
    assert lb > 0
    assert p_value(m, r, v, lb, delta) < 0.05 <= p_value(m, r, v, lb + 1e-6, delta)
    # fewer correct guesses can only lower the bound; chance level refutes nothing
    assert epsilon_lower_bound(m, r, v - 20, delta) < lb
    assert epsilon_lower_bound(m, r, r // 2, delta) == 0.0


def test_coverage_on_randomized_response():
    """ε0-randomized response on each canary's coin is exactly ε0-DP (δ = 0). The audit's
    lower bound may exceed ε0 with probability at most 5 % per run, so over n independent runs
    the count of exceedances is stochastically below Binomial(n, 0.05): we allow the count
    whose upper tail under that binomial is below 1e-3."""
    eps0, m, trials = 1.0, 400, 60
    rng = np.random.default_rng(12345)
    p_true = math.exp(eps0) / (1 + math.exp(eps0))
    exceed, bounds = 0, []
    for _ in range(trials):
        included = rng.random(m) < 0.5
        truthful = rng.random(m) < p_true
        scores = np.where(truthful, included, ~included).astype(float)
        res = audit_scores(scores, included, delta=0.0)
        bounds.append(res.epsilon_lower)
        exceed += res.epsilon_lower > eps0
    allowed = int(stats.binom.isf(1e-3, trials, 0.05))
    assert exceed <= allowed
    # and the audit is not vacuous: with all m guesses the expected accuracy p_true gives a
    # positive bound in most runs (a chance-level guesser would give 0)
    assert np.median(bounds) > 0


# ----------------------------------------------------------------------------- engine audits
M, Q, T, DELTA, EPS = 1000, 0.05, 100, 1e-5, 1.0
NORMS = {"exact": Exact(), "hutch": Hutch(32), "hutchpp": HutchPP(32)}


def _real_engine(sigma, method):
    def factory(model, opt, expected_batch_size, seed):
        return PrivacyEngine(
            model,
            opt,
            clipping=Clipping(1.0, NORMS[method]),
            noise=Gaussian(sigma),
            expected_batch_size=expected_batch_size,
            seed=seed,
        )

    return factory


class _QuarterNoiseEngine(PrivacyEngine):
    """BROKEN on purpose (test only): claims noise_multiplier σ but adds σC/4."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise = GaussianNoise(self.noise_multiplier * self.max_grad_norm / 4)


@pytest.mark.parametrize(
    "method,clipping", [("exact", "exact"), ("hutch", "hutch"), ("hutchpp", "hutchpp")]
)
def test_audit_of_the_real_engine_stays_below_the_accounted_epsilon(method, clipping):
    k = 32 if clipping != "exact" else None
    sigma = accounting.noise_multiplier(EPS, DELTA, Q, T, clipping, k)
    accounted = accounting.epsilon(sigma, Q, T, DELTA, envelope=clipping, k=k)
    assert accounted <= EPS
    run = run_gradient_canary_audit(
        _real_engine(sigma, method),
        canaries=M,
        sample_rate=Q,
        steps=T,
        noise_multiplier=sigma,
        delta=DELTA,
        seed=0,
    )
    assert run.result.epsilon_lower <= accounted, (
        f"PRIVACY BUG? audited lower bound {run.result.epsilon_lower:.3f} > accounted "
        f"epsilon {accounted:.3f} ({method}, sigma={sigma}, seed=0)"
    )


def test_audit_catches_noise_scaled_down_four_times():
    """With σ ≈ 2.1 (ε = 1) but σ/4 applied, the noise on a canary's coordinate has std
    σC/4 ≈ 0.54·C while a participation adds C: ≈ 1.9 noise standard deviations per
    participation (0.47 as claimed), and with ≈ q·T = 5 participations included and excluded
    canaries separate by ≈ 4 standard deviations. The 50 highest and 50 lowest scores are then
    almost all right, and 100 guesses with ≥ 85 right already refute ε = 1 at the Bonferroni
    level the audit uses (checked first)."""
    sigma = accounting.noise_multiplier(EPS, DELTA, Q, T, "exact")
    assert epsilon_lower_bound(M, 100, 85, DELTA, 1 - 0.05 / 4) > EPS  # the arithmetic above

    def factory(model, opt, expected_batch_size, seed):
        return _QuarterNoiseEngine(
            model,
            opt,
            clipping=Clipping(1.0, Exact()),
            noise=Gaussian(sigma),
            expected_batch_size=expected_batch_size,
            seed=seed,
        )

    run = run_gradient_canary_audit(
        factory, canaries=M, sample_rate=Q, steps=T, noise_multiplier=sigma, delta=DELTA, seed=0
    )
    assert run.result.epsilon_lower > EPS


def test_canary_updates_carry_the_clipped_contribution():
    """Without noise, u_t on canary i's coordinate is C exactly when it was sampled (times
    B_0/B, the auditor's coin-free rescaling): the harness measures what the engine
    releases."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_gradient_canary_audit(
            _real_engine(0.0, "exact"),
            canaries=20,
            sample_rate=0.3,
            steps=10,
            noise_multiplier=1.0,
            delta=DELTA,
            seed=3,
            score="sum",
        )
    u = run.updates
    assert np.all(u[:, ~run.included] == 0)
    assert np.allclose(u[u != 0], 1.0 * run.scale / run.expected_batch_size)
    assert run.scale != run.expected_batch_size  # the coins did not give exactly m/2
    assert (u[:, run.included] != 0).any()
    torch.testing.assert_close(torch.tensor(run.scores), torch.tensor(u.sum(0)))


def test_benchmark_broken_engines_still_run():
    """benchmarks/audit.py's broken engines (benchmarks.kit.engines) subclass PrivacyEngine; a
    change of the engine's internals must not leave the benchmark unable to run (one tiny
    audit step each)."""
    from benchmarks.kit import engines as bench

    for _label, kind, method in bench.CASES:
        run = run_gradient_canary_audit(
            bench.factory(kind, 1.0, method),
            canaries=20,
            sample_rate=0.5,
            steps=2,
            noise_multiplier=1.0,
            delta=DELTA,
            real_examples=10,
            micro_batch_size=4,
            seed=0,
        )
        assert run.updates.shape == (2, 20) and np.isfinite(run.updates).all(), kind
