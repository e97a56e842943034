"""Planning rules: the service plans a job with the library's planner, so the step count, δ and
σ the service charges are the ones the runner recomputes (it refuses a job whose plan differs)."""

from __future__ import annotations

import math

import pytest

from api.jobs.schemas import JobCreate
from api.jobs.views import job_request
from dprc_core.accounting import epsilon
from dprc_core.training.plan import default_delta, plan_privacy, planned_steps
from service.base.errors import InvalidInput
from service.budget.planning import JobPlan, make_plan
from service.jobs.jobs import plan_request


@pytest.mark.parametrize(
    "epochs,n,b",
    [(1, 100, 10), (3, 100, 7), (2, 1800, 32), (1, 5, 5), (7, 999, 1), (1, 10**6, 999)],
)
def test_steps_round_up(epochs, n, b):
    steps = planned_steps(n, b, epochs)
    # q = b/n: steps = ceil(epochs / q); expected examples seen cover every epoch
    assert steps * b >= epochs * n
    assert (steps - 1) * b < epochs * n


def _request(**privacy) -> JobCreate:
    return JobCreate.model_validate(
        {
            "model": "dprc-tiny-llama",
            "training_file": "file-x",
            "hyperparameters": {"n_epochs": 2, "batch_size": 16},
            "privacy": {"target_epsilon": 3.0, **privacy},
        }
    )


def _plan(req: JobCreate, n: int, default_k: int) -> JobPlan:
    """The service's plan of the API request ``req`` (as job creation makes it)."""
    return make_plan(plan_request(job_request(req)), n, default_k)


@pytest.mark.parametrize(
    "clipping,k_acc",
    [
        ({"method": "exact"}, None),
        ({"method": "hutch", "k": 8}, 8),
        ({"method": "auto", "k": 16}, 16),
    ],
)
def test_service_plan_is_the_runners_plan(clipping, k_acc):
    n = 333
    plan = _plan(_request(clipping=clipping), n, default_k=32)
    acc = (
        "exact"
        if clipping["method"] == "exact"
        else "hutch"
        if clipping["method"] == "auto"
        else clipping["method"]
    )
    # what the runner computes for the σ the worker hands it
    lib = plan_privacy(
        dataset_size=n,
        batch_size=16,
        epochs=2,
        clipping=acc,
        k=k_acc,
        noise_multiplier_value=plan.noise_multiplier,
        sketch=plan.sketch,
    )
    assert (plan.steps, plan.target_delta, plan.sample_rate) == (
        lib.steps,
        lib.delta,
        lib.sample_rate,
    )
    assert plan.steps == math.ceil(2 * n / 16) and plan.target_delta == default_delta(n)
    # σ meets the target under the accountant, independently recomputed
    # a randomized method runs per-example sketches unless the request says otherwise
    assert plan.sketch == ("shared" if acc == "exact" else "per_example")
    eps = epsilon(
        plan.noise_multiplier, 16 / n, plan.steps, plan.target_delta, acc, k_acc, sketch=plan.sketch
    )
    assert eps <= 3.0 and plan.planned_epsilon == pytest.approx(eps, rel=1e-9)


def test_nu_dpftrl_plan_is_the_runners_plan():
    n = 100
    req = _request(clipping={"method": "exact"}, noise={"mechanism": "nu_dpftrl", "nu": 0.1})
    plan = _plan(req, n, default_k=32)
    lib = plan_privacy(
        dataset_size=n,
        batch_size=16,
        epochs=2,
        clipping="exact",
        k=None,
        noise_multiplier_value=plan.noise_multiplier,
        mechanism="nu_dpftrl",
        nu=0.1,
    )
    assert plan.steps == lib.steps == 2 * math.ceil(n / 16)
    assert plan.min_separation == lib.min_separation == math.ceil(n / 16)
    assert plan.planned_epsilon == pytest.approx(lib.planned_epsilon, rel=1e-12)
    assert plan.planned_epsilon <= 3.0


def test_delta_above_one_over_n_is_refused():
    with pytest.raises(InvalidInput, match="above 1/N"):
        _plan(_request(target_delta=0.01), 333, default_k=32)
    with pytest.raises(ValueError, match="above 1/N"):
        plan_privacy(
            dataset_size=333,
            batch_size=16,
            epochs=1,
            clipping="exact",
            k=None,
            target_epsilon=3.0,
            delta=0.01,
        )
