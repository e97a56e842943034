"""A data set's budget in-process (docs/design.md §7 "Budgets", docs/api.md "Privacy budgets"):
a job reserves its planned event and the check composes the data set's events (never a sum of
ε's); a job beyond the budget is refused (409 ``budget_exceeded``); an ended job settles to the
steps that ran, once. The expected ε's are composed here with Google's ``dp_accounting`` (PLD,
add-or-remove, pessimistic), within the tolerance documented for the accountant against it:
ours −0.5 % / +1 % of the reference (tests/dprc_core/accounting/test_exact_vs_dp_accounting.py;
docs/accounting.md §4)."""

from __future__ import annotations

import json

import dp_accounting
import pytest

from service.base.errors import Conflict, InvalidInput, PermissionDenied
from service.data import files
from service.jobs import job_runs, jobs
from service.store.job_status import JobStatus
from tests.service.conftest import reviews

LOW, HIGH = -0.005, 0.01  # ours / reference − 1


def reference_epsilon(runs: list[tuple[float, float, int]], delta: float) -> float:
    """dp_accounting's ε at ``delta`` of Poisson-subsampled Gaussian runs (σ, q, steps) composed."""
    accountant = dp_accounting.pld.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4,
    )
    for sigma, q, steps in runs:
        if steps:
            event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
            accountant.compose(event, steps)
    return accountant.get_epsilon(delta)


def assert_matches(ours: float | None, reference: float) -> None:
    assert ours is not None
    rel = ours / reference - 1.0
    assert LOW <= rel <= HIGH, f"ours={ours} reference={reference} ({rel:+.3%})"


def run_of(job, steps: int | None = None) -> tuple[float, float, int]:
    """(σ, q, steps) of an exact-clipping job as its privacy object shows it."""
    privacy = job.privacy
    assert privacy["clipping"]["method"] == "exact"
    n = privacy["steps"] if steps is None else steps
    return privacy["noise_multiplier"], privacy["sample_rate"], n


def shown(domain, file_id: str):
    data_set = files.retrieve(domain.store, domain.acme.owner, file_id)
    assert data_set.budget is not None
    return data_set.budget


def test_the_plan_meets_the_target(domain):
    data_set = domain.upload(domain.acme.owner, reviews(), epsilon=8.0)
    job = domain.create_job(domain.acme.trainer, data_set.row.id, epsilon=2.0)
    sigma, q, steps = run_of(job)
    assert (q, steps) == (20 / 40, 2)  # batch 20 of N = 40, one epoch: ⌈40/20⌉ steps
    reference = reference_epsilon([(sigma, q, steps)], job.privacy["target_delta"])
    # calibrated from below (planned ε ≤ target), and ours ≥ 0.995 × the reference
    assert job.privacy["planned_epsilon"] <= 2.0
    assert reference <= 2.0 / (1 + LOW)
    assert reference >= 2.0 * 0.98  # not needlessly noisy: calibration's tolerance is 0.5 %


def test_two_jobs_reserve_their_composition_not_the_sum(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=3.5)
    first = domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    budget = shown(domain, data_set.row.id)
    delta = budget.delta
    assert_matches(budget.committed, reference_epsilon([run_of(first)], delta))
    assert budget.spent == 0.0
    second = domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    both = reference_epsilon([run_of(first), run_of(second)], delta)
    assert both < 3.5 < 2 * 2.0  # fits composed, would not as a sum of the targets
    budget = shown(domain, data_set.row.id)
    assert_matches(budget.committed, both)
    assert_matches(budget.reserved, both)  # nothing ran: all of it reserved
    assert budget.remaining == pytest.approx(3.5 - budget.committed)


def test_a_job_beyond_the_budget_is_refused_and_changes_nothing(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=2.8)
    first = domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    delta = data_set.budget.delta
    assert reference_epsilon([run_of(first)] * 2, delta) > 2.8 * (1 + HIGH)
    before = shown(domain, data_set.row.id)
    with pytest.raises(Conflict) as refused:
        domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    assert refused.value.code == "budget_exceeded"
    assert refused.value.param == "training_file"
    assert "remaining" in refused.value.message
    assert shown(domain, data_set.row.id) == before
    assert len(jobs.list_jobs(domain.store, acme.viewer, None, 100)[0]) == 1
    assert len(domain.audit(acme, "job.create")) == 1


def test_cancelling_a_queued_job_releases_its_reservation(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=4.0)
    kept = domain.create_job(acme.trainer, data_set.row.id, epsilon=1.0)
    dropped = domain.create_job(acme.trainer, data_set.row.id, epsilon=1.0)
    jobs.cancel(domain.store, acme.trainer, dropped.id)
    budget = shown(domain, data_set.row.id)
    assert_matches(budget.committed, reference_epsilon([run_of(kept)], budget.delta))


def test_a_cancelled_run_settles_to_its_steps_once(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=4.0)
    job = domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    delta = data_set.budget.delta  # as uploaded: a read now would cache spent for 2 s
    one_step = reference_epsilon([run_of(job, 1)], delta)
    assert job_runs.start_job(domain.store, job.id, "worker-1")
    job_runs.record_progress(domain.store, job.id, 1, one_step)  # step 1 of 2 started
    running = shown(domain, data_set.row.id)  # a read composes the steps that ran so far
    assert_matches(running.spent, one_step)
    assert_matches(running.committed, reference_epsilon([run_of(job)], delta))
    asked = jobs.cancel(domain.store, acme.trainer, job.id)  # deferred: the worker ends it
    assert asked.status == JobStatus.RUNNING and asked.cancel_requested
    job_runs.end_job(domain.store, job.id, "cancelled")
    settled = shown(domain, data_set.row.id)
    assert_matches(settled.committed, one_step)
    assert_matches(settled.spent, one_step)
    assert settled.reserved == pytest.approx(0.0, abs=1e-12)
    # ended twice (a redelivered task): refused, nothing charged again
    with pytest.raises(Conflict):
        job_runs.end_job(domain.store, job.id, "cancelled")
    with pytest.raises(Conflict):
        job_runs.end_job(domain.store, job.id, "succeeded")
    assert jobs.cancel(domain.store, acme.trainer, job.id).status == JobStatus.CANCELLED
    assert shown(domain, data_set.row.id) == settled
    assert domain.job(job.id).status == JobStatus.CANCELLED
    assert len(domain.audit(acme, "job.cancel")) == 1


def test_a_deleted_data_set_keeps_what_it_spent(domain):
    """Deleting and re-uploading the same data does not reset its budget (the threat model)."""
    acme = domain.acme
    data = reviews()
    data_set = domain.upload(acme.owner, data, epsilon=4.0)
    job = domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    assert job_runs.start_job(domain.store, job.id, "worker-1")
    job_runs.record_progress(domain.store, job.id, 1, 0.0)
    job_runs.end_job(domain.store, job.id, "failed", error_code="boom", error_message="boom")
    spent = shown(domain, data_set.row.id).spent
    assert_matches(spent, reference_epsilon([run_of(job, 1)], data_set.budget.delta))
    files.delete(domain.store, acme.trainer, data_set.row.id)
    with pytest.raises(Conflict) as fresh:  # asking a fresh budget for the same data
        domain.upload(acme.owner, data, epsilon=100.0)
    assert fresh.value.code == "budget_group_conflict"
    assert data_set.group_id in fresh.value.message
    again = domain.upload(acme.owner, data)
    assert again.joined is True and again.group_id == data_set.group_id
    budget = shown(domain, again.row.id)
    assert budget.epsilon == 4.0 and budget.spent == pytest.approx(spent)


def test_a_budget_change_needs_a_reason_and_room_for_what_is_committed(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=4.0)
    domain.create_job(acme.trainer, data_set.row.id, epsilon=2.0)
    committed = shown(domain, data_set.row.id).committed
    assert committed is not None
    with pytest.raises(InvalidInput) as no_reason:
        files.set_budget(domain.store, acme.owner, data_set.row.id, 3.0, None, "")
    assert no_reason.value.param == "reason"
    with pytest.raises(Conflict) as too_low:
        files.set_budget(domain.store, acme.owner, data_set.row.id, committed * 0.9, None, "cut")
    assert too_low.value.code == "budget_exceeded"
    with pytest.raises(PermissionDenied):
        files.set_budget(domain.store, acme.trainer, data_set.row.id, 9.0, None, "more")
    assert shown(domain, data_set.row.id).epsilon == 4.0
    assert domain.audit(acme, "budget.change") == []
    files.set_budget(domain.store, acme.owner, data_set.row.id, 2.5, None, "a tighter budget")
    assert shown(domain, data_set.row.id).epsilon == 2.5
    (entry,) = domain.audit(acme, "budget.change")
    detail = json.loads(entry.detail)
    assert detail["before"]["epsilon"] == 4.0 and detail["after"]["epsilon"] == 2.5
    assert detail["reason"] == "a tighter budget" and entry.key_id == acme.owner.key_id
