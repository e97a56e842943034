"""The many-trial audit of one engine step (dprc_core/auditing/step_trials.py).

* the bound is a valid lower bound: on a Gaussian mechanism sampled directly with numpy, whose
  exact (ε, δ) profile is known in closed form, it exceeds the true ε in at most its 5 % of
  runs, and is not vacuous;
* the real engine (exact, and hutch with per-example sketches) stays below its accounted ε;
* the engine adding half the noise it claims is refuted — what the one-run audit could not do;
* shared sketches are refused (their trials are dependent).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dprc_core import Clipping, Gaussian, PrivacyEngine, accounting
from dprc_core.auditing.step_trials import (
    THRESHOLDS,
    bilinear_loss,
    run_step_trial_audit,
    trial_lower_bound,
)
from dprc_core.clipping import norm_from_method
from dprc_core.noise import GaussianNoise

DELTA = 1e-5


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε(δ) of N(0, 1) against N(μ, 1) (Balle & Wang 2018, Theorem 8)."""

    def gap(eps: float) -> float:
        return (
            stats.norm.cdf(-eps / mu + mu / 2)
            - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
            - delta
        )

    return optimize.brentq(gap, 1e-9, 60.0)


def test_coverage_on_a_gaussian_mechanism():
    """N(μ, 1) vs N(0, 1) with μ = 1/2: exact ε at δ = 1e-5 ≈ 2.2. Each run's bound exceeds
    it with probability ≤ 5 %; over 40 runs we allow the count whose Binomial(40, 0.05) upper
    tail is below 1e-3."""
    mu, runs, n = 0.5, 40, 100_000
    true_eps = gaussian_epsilon(mu, DELTA)
    rng = np.random.default_rng(7)
    grid = [t / mu for t in THRESHOLDS]  # thresholds at multiples of σ = 1/μ in units of C
    exceed, bounds = 0, []
    for _ in range(runs):
        inc = rng.random(n) < 0.5
        scores = rng.normal(size=n) / mu + inc  # units of the sensitivity: σ = 1/μ
        b = trial_lower_bound(scores, inc, DELTA, grid)
        bounds.append(b.epsilon_lower)
        exceed += b.epsilon_lower > true_eps
    assert exceed <= int(stats.binom.isf(1e-3, runs, 0.05))
    assert np.median(bounds) > 0.5 * true_eps  # not vacuous


def test_bound_refuses_bad_input():
    with pytest.raises(ValueError):
        trial_lower_bound(np.zeros(4), np.ones(4, bool), DELTA, [1.0])  # no "out" trials
    with pytest.raises(ValueError):
        trial_lower_bound(np.array([0.0, np.nan]), np.array([True, False]), DELTA, [1.0])
    with pytest.raises(ValueError):
        trial_lower_bound(np.zeros(2), np.array([True, False]), DELTA, [])


def _engine(sigma: float, norm_method: str, sketch: str, noise_divisor: float = 1.0):
    class Engine(PrivacyEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if noise_divisor != 1.0:  # BROKEN on purpose (test only): claims σ, adds less
                self.noise = GaussianNoise(
                    self.noise_multiplier * self.max_grad_norm / noise_divisor
                )

    def make(model, opt, expected_batch_size, seed):
        return Engine(
            model,
            opt,
            clipping=Clipping(1.0, norm_from_method(norm_method, k=32, sketch=sketch)),
            noise=Gaussian(sigma),
            expected_batch_size=expected_batch_size,
            seed=seed,
        )

    return make


def _claim(norm_method: str, sketch: str, eps: float) -> tuple[float, float]:
    k = None if norm_method == "exact" else 32
    sigma = accounting.noise_multiplier(eps, DELTA, 1.0, 1, norm_method, k, sketch=sketch)
    return sigma, accounting.epsilon(sigma, 1.0, 1, DELTA, envelope=norm_method, k=k, sketch=sketch)


def test_canary_coordinates_carry_the_clipped_contribution():
    """σ = 0 and exact clipping: an included canary's score is exactly 1 (C), an excluded one
    exactly 0, whatever the real examples and micro-batches do."""
    audit = run_step_trial_audit(
        _engine(1.0, "exact", "shared", noise_divisor=math.inf),
        side=6,
        repetitions=3,
        noise_multiplier=1.0,
        delta=DELTA,
        micro_batch_size=5,
    )
    np.testing.assert_allclose(audit.scores, audit.included.astype(float), atol=1e-12)


@pytest.mark.parametrize(
    ("norm_method", "sketch", "side", "reps"),
    [
        ("exact", "shared", 32, 200),
        ("hutch", "per_example", 24, 40),
    ],
)
def test_the_real_engine_stays_below_its_accounted_epsilon(norm_method, sketch, side, reps):
    sigma, accounted = _claim(norm_method, sketch, 1.0)
    audit = run_step_trial_audit(
        _engine(sigma, norm_method, sketch),
        side=side,
        repetitions=reps,
        noise_multiplier=sigma,
        delta=DELTA,
        seed=1,
    )
    assert audit.bound.epsilon_lower <= accounted, (
        f"PRIVACY BUG? audited lower bound {audit.bound} above the accounted {accounted:.3f}"
    )


def test_half_the_claimed_noise_is_refuted():
    """Claim ε = 1 for one step at q = 1 (σ ≈ 3.74), add σ/2: the step's true ε is ≈ 2.15 and
    2·10⁵ trials put the bound above 1 (≈ 1.3 expected)."""
    sigma, accounted = _claim("exact", "shared", 1.0)
    audit = run_step_trial_audit(
        _engine(sigma, "exact", "shared", noise_divisor=2.0),
        side=32,
        repetitions=200,
        noise_multiplier=sigma,
        delta=DELTA,
        seed=2,
    )
    assert audit.bound.epsilon_lower > accounted


def test_shared_sketches_are_refused():
    with pytest.raises(ValueError, match="shared sketch"):
        run_step_trial_audit(
            _engine(3.0, "hutch", "shared"),
            side=4,
            repetitions=1,
            noise_multiplier=3.0,
            delta=DELTA,
        )


def test_bilinear_loss_gradient_is_the_outer_product():
    import torch

    model = torch.nn.Linear(3, 2, bias=False).double()
    x, y = torch.randn(1, 3, dtype=torch.float64), torch.randn(1, 2, dtype=torch.float64)
    bilinear_loss(model, torch.cat([x, y], 1)).sum().backward()
    torch.testing.assert_close(model.weight.grad, y.T @ x)


def _user_engine(sigma: float, per_line: bool = False):
    """Exact clipping, σ claimed; ``per_line``: BROKEN on purpose (test only) — it drops the
    user ids and clips each line on its own while claiming user-level DP."""

    class Engine(PrivacyEngine):
        def accumulate(self, loss_fn, batch, example_ids=None, user_ids=None):
            if per_line:
                return super().accumulate(loss_fn, batch)
            return super().accumulate(loss_fn, batch, example_ids, user_ids)

    def make(model, opt, expected_batch_size, seed):
        return Engine(
            model,
            opt,
            clipping=Clipping(1.0, norm_from_method("exact")),
            noise=Gaussian(sigma),
            expected_batch_size=expected_batch_size,
            seed=seed,
        )

    return make


def test_a_canary_user_of_several_lines_adds_c_once():
    """σ = 0: a canary user of 4 lines scores exactly 1 (C) when in, 0 when out; the per-line
    engine scores 4."""
    for per_line, want in ((False, 1.0), (True, 4.0)):
        audit = run_step_trial_audit(
            _user_engine(0.0, per_line),
            side=4,
            repetitions=3,
            noise_multiplier=1.0,
            delta=DELTA,
            micro_batch_size=6,
            by_user=True,
            canary_lines=4,
        )
        np.testing.assert_allclose(audit.scores, want * audit.included, atol=1e-12)


def test_user_level_stays_below_its_accounted_epsilon_and_per_line_clipping_is_refuted():
    """Canary users of 4 lines, σ claimed for ε = 1 per user at q = 1: the user-level engine's
    bound stays below 1; the engine that clips each line (4·C a canary user) is refuted."""
    sigma, accounted = _claim("exact", "shared", 1.0)
    kwargs = dict(
        side=16, repetitions=40, noise_multiplier=sigma, delta=DELTA, by_user=True, canary_lines=4
    )
    honest = run_step_trial_audit(_user_engine(sigma), seed=3, **kwargs)
    assert honest.bound.epsilon_lower <= accounted, (
        f"PRIVACY BUG? audited lower bound {honest.bound} above the accounted {accounted:.3f}"
    )
    broken = run_step_trial_audit(_user_engine(sigma, per_line=True), seed=4, **kwargs)
    assert broken.bound.epsilon_lower > accounted, broken.bound
