"""The ε curve of a run (dprc_core/accounting/step_epsilons.py): ε after n steps from the plan's
one-step PLD kept across steps, against independent recomputations — Google dp_accounting for
the Gaussian step, the project's ledger at exactly n steps for every mechanism — at every n."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl

from dprc_core.accounting import (
    NuDPFTRLEvent,
    PrivacyLedger,
    SubsampledGaussianEvent,
    dpftrl_epsilon,
)
from dprc_core.accounting.step_epsilons import LEDGER_TOLERANCE, StepEpsilons


def _ledger(events, delta: float) -> float:
    return PrivacyLedger(events).epsilon(delta)


def _check_against_ledger(curve: StepEpsilons, ns=None) -> list[float]:
    """Every value is the ledger's at exactly n steps within LEDGER_TOLERANCE, the last one
    identically (the same computation), and the values never decrease."""
    values = []
    for n in ns or range(1, curve.steps + 1):
        ours = curve.epsilon(n)
        want = _ledger(curve.events(n), curve.delta)
        assert abs(ours - want) <= LEDGER_TOLERANCE * want, (n, ours, want)
        values.append(ours)
    assert values == sorted(values)
    last = curve.steps
    assert curve.epsilon(last) == _ledger(curve.events(last), curve.delta)
    return values


def _dp_accounting(sigma: float, q: float, steps: int, delta: float, h: float = 1e-4) -> float:
    pld = dpl.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=h, pessimistic_estimate=True
    )
    return (
        pld.self_compose(steps).get_epsilon_for_delta(delta)
        if steps > 1
        else (pld.get_epsilon_for_delta(delta))
    )


def test_the_gaussian_curve_is_dp_accountings_epsilon_at_every_step():
    sigma, q, steps, delta = 1.0, 0.1, 20, 1e-5
    curve = StepEpsilons(SubsampledGaussianEvent(sigma, q, 1), steps, delta)
    for n in range(1, steps + 1):
        ref = _dp_accounting(sigma, q, n, delta)
        ours = curve.epsilon(n)
        # both pessimistic: ours an upper bound at its own grid, the reference at h = 1e-4
        assert -0.005 <= ours / ref - 1.0 <= 0.01, (n, ours, ref)
    _check_against_ledger(curve)


def test_a_small_rate_long_plan_matches_the_ledger():
    curve = StepEpsilons(SubsampledGaussianEvent(0.8, 256 / 50_000, 1), 600, 1e-5)
    _check_against_ledger(curve, [1, 2, 3, 7, 50, 299, 600])


@pytest.mark.parametrize("sketch", ["per_example", "shared"])
def test_randomized_clipping_curves_match_the_ledger(sketch):
    step = SubsampledGaussianEvent(1.0, 8 / 48, 1, "hutch", 32, sketch=sketch)
    _check_against_ledger(StepEpsilons(step, 6, 1e-5))


def test_hutchpp_matches_the_ledger():
    step = SubsampledGaussianEvent(1.2, 0.05, 1, "hutchpp", 16, sketch="per_example")
    _check_against_ledger(StepEpsilons(step, 40, 1e-6), [1, 2, 9, 20, 40])


@pytest.mark.parametrize("bands", [None, 3])
def test_nu_dpftrl_curve_is_the_first_steps_of_the_chain(bands):
    step = NuDPFTRLEvent.prefix(2.0, 1, 0.1, 6, bands)
    curve = StepEpsilons(step, 30, 1e-5)
    for n in range(1, 31):
        want = dpftrl_epsilon(2.0, 1e-5, 0.1, n, math.ceil(n / 6), 6, bands)
        assert curve.epsilon(n) == pytest.approx(want, rel=1e-9)
        assert curve.epsilon(n) == pytest.approx(_ledger(curve.events(n), 1e-5), rel=1e-9)


def test_a_resume_as_planned_is_the_same_curve():
    step = SubsampledGaussianEvent(1.0, 8 / 48, 1, "hutch", 32, sketch="per_example")
    fresh = StepEpsilons(step, 9, 1e-5)
    resumed = StepEpsilons(step, 5, 1e-5, fixed=[step.first_steps(4)])
    assert resumed.events(5) == [step.first_steps(4), step.first_steps(5)]
    for n in range(1, 6):
        assert resumed.epsilon(n) == fresh.epsilon(4 + n)  # the same composition, identically
    _check_against_ledger(resumed)


def test_a_departure_is_accounted_with_its_prior_events():
    step = SubsampledGaussianEvent(1.0, 8 / 48, 1)
    prior = [SubsampledGaussianEvent(1.5, 8 / 48, 4), SubsampledGaussianEvent(1.0, 0.1, 2)]
    curve = StepEpsilons(step, 5, 1e-5, fixed=prior)
    assert curve.epsilon(0) == pytest.approx(_ledger(prior, 1e-5), rel=LEDGER_TOLERANCE)
    _check_against_ledger(curve)


def test_steps_outside_the_curve_are_refused():
    curve = StepEpsilons(SubsampledGaussianEvent(1.0, 0.1, 1), 3, 1e-5)
    assert curve.epsilon(0) == 0.0
    for n in (-1, 4, 1.5, True):
        with pytest.raises(ValueError):
            curve.epsilon(n)
