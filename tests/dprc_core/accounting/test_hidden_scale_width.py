"""The hidden-scale model's coarser scale law (``AccountingSettings.hidden_scale_width``, 1 %;
docs/accounting.md §10, "The scale law's width") and its cheaper loss ranges.

The references are the same accountant with a 10× and a 100× finer scale law (the same grid,
tail budget and composition), and scipy's root finder for the loss range's ends: a coarser law
may only raise ε, every width is an upper bound, and a σ calibrated on the coarse law meets its
target on the finer ones too.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import optimize

from dprc_core import accounting
from dprc_core.accounting.accountant import account
from dprc_core.accounting.events import SubsampledGaussianEvent
from dprc_core.accounting.hidden_scale_pld import (
    hidden_delta,
    hidden_loss_range,
    hidden_lower_tail,
)
from dprc_core.accounting.random_scale_pld import StepMechanism
from dprc_core.accounting.settings import DEFAULT_SETTINGS
from dprc_core.accounting.subsampled_gaussian_builder import scale_distribution

PER_EXAMPLE = "per_example"
FINE = replace(DEFAULT_SETTINGS, hidden_scale_width=1e-3)  # the former default
FINER = replace(DEFAULT_SETTINGS, hidden_scale_width=1e-4)  # ~11,000 atoms at k = 32

# (σ, q, steps, k, rank, δ): the budget benchmark's burst (N = 400, batch 20, one epoch) and
# points of the hidden-scale tests, small and large k, with and without a rank
CASES = [
    (0.81, 0.05, 20, 32, None, 1.3e-3),
    (1.1, 0.02, 400, 32, None, 1e-5),
    (0.7, 0.05, 200, 16, None, 1e-5),
    (2.0, 0.01, 500, 64, None, 1e-6),
    (0.9, 0.03, 300, 32, 4, 1e-5),
    (1.5, 0.1, 50, 8, None, 1e-5),
]


def _eps(event: SubsampledGaussianEvent, delta: float, settings=DEFAULT_SETTINGS) -> float:
    return account([event], delta, settings).epsilon


@pytest.mark.parametrize("sigma,q,steps,k,rank,delta", CASES)
def test_coarse_law_is_above_the_fine_and_the_finer(sigma, q, steps, k, rank, delta):
    """ε(1 %) ≥ ε(0.1 %) ≥ ε(0.01 %): each coarsening only raises ε, and the default's
    pessimism against the 100× finer law stays below 2 %."""
    event = SubsampledGaussianEvent(sigma, q, steps, "hutch", k, rank, sketch=PER_EXAMPLE)
    coarse = account([event], delta)
    fine = account([event], delta, FINE)
    finer = _eps(event, delta, FINER)
    assert coarse.epsilon >= fine.epsilon >= finer, (coarse.epsilon, fine.epsilon, finer)
    assert coarse.epsilon <= finer * 1.02, (coarse.epsilon, finer)
    # the default accounts the coarse law (~10× fewer atoms than the former 0.1 %)
    assert coarse.scale_bins[0] * 8 < fine.scale_bins[0]


def test_the_widths_are_separate_knobs():
    """The revealed-scale model keeps its 0.1 % law; ``finer`` refines both."""
    shared = SubsampledGaussianEvent(1.1, 0.02, 400, "hutch", 32)
    assert account([shared], 1e-5).scale_bins[0] > 1000
    assert DEFAULT_SETTINGS.width_for(True) == DEFAULT_SETTINGS.hidden_scale_width == 0.01
    assert DEFAULT_SETTINGS.width_for(False) == DEFAULT_SETTINGS.scale_width == 0.001
    assert DEFAULT_SETTINGS.finer(10).width_for(True) == pytest.approx(0.001)


@pytest.mark.parametrize("target", [1.0, 2.0, 3.45])
def test_sigma_calibrated_on_the_coarse_law_meets_the_target_on_finer_laws(target):
    """The burst's plan (q = 0.05, 20 steps, k = 32, δ = 1.3e-3): ε(σ) ≤ target on the coarse
    law (the plan's ε), hence on the 10× and 100× finer laws; one calibration step below σ
    the coarse law exceeds the target (the calibration is not loose)."""
    q, steps, delta = 0.05, 20, 1.3e-3
    sigma = accounting.noise_multiplier(target, delta, q, steps, "hutch", 32, sketch=PER_EXAMPLE)

    def event(s: float) -> SubsampledGaussianEvent:
        return SubsampledGaussianEvent(s, q, steps, "hutch", 32, sketch=PER_EXAMPLE)

    planned = _eps(event(sigma), delta)
    assert planned <= target
    assert _eps(event(sigma), delta, FINE) <= planned
    assert _eps(event(sigma), delta, FINER) <= planned
    assert _eps(event(sigma / 1.005), delta) > target


def test_service_plan_charges_what_the_accountant_computes():
    """The service's plan of the burst's create: its planned ε is ≤ the target and is the ε
    the accountant (and the history of a data set holding only this job) computes for its
    event — the number the budget charges and the worker's ledger records."""
    from dprc_core.accounting.history import epsilon_for_history
    from dprc_core.noise import Gaussian
    from service.budget.planning import library_plan

    plan = library_plan(400, 20, 1, "hutch", 32, 2.35, None, Gaussian(), PER_EXAMPLE)
    event = plan.event()
    assert event.sketch == PER_EXAMPLE
    assert plan.planned_epsilon <= 2.35
    assert _eps(event, plan.delta) == plan.planned_epsilon
    assert epsilon_for_history([event], plan.delta) == plan.planned_epsilon
    assert _eps(event, plan.delta, FINER) <= plan.planned_epsilon


@pytest.mark.parametrize("sigma,q,k", [(0.81, 0.05, 32), (2.0, 0.005, 64), (0.5, 0.3, 8)])
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_loss_range_ends_are_on_the_safe_side_and_close(sigma, q, k, direction):
    """hidden_loss_range's ends (one bisection call after the probe): δ(hi) ≤ τ and
    P(L < lo) ≤ τ, each within 0.5 % (of itself, or 1e-9) of the exact end found by brentq."""
    tail = 1e-3 * 1e-5 / 100
    event = SubsampledGaussianEvent(sigma, q, 1, "hutch", k, sketch=PER_EXAMPLE)
    mech = StepMechanism(sigma, q, scale_distribution(event, tail / (4 * q), 0.05))
    lo, hi = hidden_loss_range(mech, direction, tail)
    log1m_q = math.log1p(-q)

    def upper(x: float) -> float:
        return float(hidden_delta(np.array([x]), mech, direction, False)[0]) - tail

    def lower(x: float) -> float:
        return float(hidden_lower_tail(np.array([x]), mech, direction)[0]) - tail

    assert upper(hi) <= 0.0
    if direction == "remove":  # hi is finite only where δ vanishes above it
        exact_hi = optimize.brentq(upper, 1e-9, 1e4, xtol=1e-14, rtol=1e-14)
        assert exact_hi <= hi <= exact_hi + 5e-3 * abs(exact_hi) + 1e-9
    else:
        assert hi == pytest.approx(-log1m_q)
    if direction == "remove" and lower(log1m_q + 1e-12) > 0:  # the lower end is the hard one
        assert lo == pytest.approx(log1m_q, abs=1e-9)
        return
    assert lower(lo) <= 0.0
    a = log1m_q + 1e-12 if direction == "remove" else -1e4  # the loss is > log(1 − q)
    exact_lo = optimize.brentq(lower, a, hi, xtol=1e-14, rtol=1e-14)
    assert exact_lo - 5e-3 * abs(exact_lo) - 1e-9 <= lo <= exact_lo
