"""A job's lifecycle in-process (docs/api.md, the job endpoints' table and "Job lifecycle"): what a
client's cancel, pause and resume do from each status, the requests a running job's worker
carries out, and what happens when that worker dies. Every client move that changes something
is audited once; a refused or repeated one changes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.base.errors import Conflict
from service.data import files
from service.jobs import job_runs, jobs, lifecycle
from service.store.job_status import JobStatus as S
from tests.service.conftest import reviews


def _queued(domain, job_id: str) -> None:
    pass


def _paused(domain, job_id: str) -> None:
    jobs.pause(domain.store, domain.acme.trainer, job_id)


def _running(domain, job_id: str) -> None:
    assert job_runs.start_job(domain.store, job_id, "worker-1")


def _ended(status: str) -> Callable[..., None]:
    def end(domain, job_id: str) -> None:
        _running(domain, job_id)
        job_runs.record_progress(domain.store, job_id, 2, 0.0)
        job_runs.end_job(domain.store, job_id, status)

    return end


def _cancelled(domain, job_id: str) -> None:
    jobs.cancel(domain.store, domain.acme.trainer, job_id)


SETUP = {
    S.QUEUED: _queued,
    S.PAUSED: _paused,
    S.RUNNING: _running,
    S.SUCCEEDED: _ended("succeeded"),
    S.FAILED: _ended("failed"),
    S.CANCELLED: _cancelled,
}

# (status, move) → (status after, request flag set) or Conflict, from docs/api.md
CANCEL, PAUSE, RESUME = "cancel", "pause", "resume"
OUTCOMES = {
    (S.QUEUED, CANCEL): (S.CANCELLED, None),
    (S.PAUSED, CANCEL): (S.CANCELLED, None),
    (S.RUNNING, CANCEL): (S.RUNNING, "cancel_requested"),  # the worker stops after the step
    (S.CANCELLED, CANCEL): "as is",  # 200, idempotent
    (S.SUCCEEDED, CANCEL): Conflict,
    (S.FAILED, CANCEL): Conflict,
    (S.QUEUED, PAUSE): (S.PAUSED, None),
    (S.RUNNING, PAUSE): (S.RUNNING, "pause_requested"),
    (S.SUCCEEDED, PAUSE): Conflict,
    (S.FAILED, PAUSE): Conflict,
    (S.CANCELLED, PAUSE): Conflict,
    (S.PAUSED, RESUME): (S.QUEUED, None),
    (S.QUEUED, RESUME): Conflict,
    (S.RUNNING, RESUME): Conflict,
    (S.SUCCEEDED, RESUME): Conflict,
    (S.FAILED, RESUME): Conflict,
    (S.CANCELLED, RESUME): Conflict,
}
MOVES = {CANCEL: jobs.cancel, PAUSE: jobs.pause, RESUME: jobs.resume}


@pytest.fixture()
def job_of(domain):
    data_set = domain.upload(domain.acme.owner, reviews(), epsilon=20.0)

    def make(status: S):
        job = domain.create_job(domain.acme.trainer, data_set.row.id)
        SETUP[status](domain, job.id)
        assert domain.job(job.id).status == status
        return domain.job(job.id)

    return make


@pytest.mark.parametrize(("status", "move"), sorted(OUTCOMES))
def test_a_clients_move_from_each_status(domain, job_of, status, move):
    job = job_of(status)
    expected = OUTCOMES[(status, move)]
    entries = len(domain.audit(domain.acme))
    if expected is Conflict:
        with pytest.raises(Conflict) as refused:
            MOVES[move](domain.store, domain.acme.trainer, job.id)
        assert refused.value.param == "fine_tuning_job_id"
        assert status.value in refused.value.message
        expected = "as is"
    else:
        answered = MOVES[move](domain.store, domain.acme.trainer, job.id)
        assert answered.status == (status if expected == "as is" else expected[0])
    after = domain.job(job.id)
    if expected == "as is":
        assert after.status == status
        assert (after.cancel_requested, after.pause_requested) == (
            job.cancel_requested,
            job.pause_requested,
        )
        assert len(domain.audit(domain.acme)) == entries  # nothing changed: nothing recorded
        return
    target, flag = expected
    assert after.status == target
    if flag is not None:
        assert getattr(after, flag) is True
    (entry,) = domain.audit(domain.acme)[entries:]
    assert entry.action == f"job.{move}" and entry.resource == job.id
    assert entry.key_id == domain.acme.trainer.key_id


def test_a_pause_is_refused_once_a_cancel_is_pending(domain, job_of):
    job = job_of(S.RUNNING)
    jobs.cancel(domain.store, domain.acme.trainer, job.id)
    with pytest.raises(Conflict):
        jobs.pause(domain.store, domain.acme.trainer, job.id)
    after = domain.job(job.id)
    assert after.cancel_requested and not after.pause_requested


def test_a_requested_pause_keeps_the_reservation_and_resumes(domain, job_of):
    job = job_of(S.RUNNING)
    jobs.pause(domain.store, domain.acme.trainer, job.id)
    assert lifecycle.stop_requested(domain.store, job.id) == (False, True)
    assert not job_runs.mark_paused(domain.store, job.id, "another-worker")  # not its lease
    assert job_runs.mark_paused(domain.store, job.id, "worker-1")
    paused = domain.job(job.id)
    assert paused.status == S.PAUSED and not paused.pause_requested
    assert paused.lease_owner is None
    resumed = jobs.resume(domain.store, domain.acme.trainer, job.id)
    assert resumed.status == S.QUEUED
    assert job_runs.start_job(domain.store, job.id, "worker-2")
    assert domain.job(job.id).attempts == 2


def test_a_live_lease_is_not_taken_over_and_an_expired_one_is(domain, job_of):
    job = job_of(S.QUEUED)
    assert job_runs.start_job(domain.store, job.id, "worker-1", lease_seconds=60)
    assert not job_runs.start_job(domain.store, job.id, "worker-2")
    assert domain.job(job.id).lease_owner == "worker-1"
    other = job_of(S.QUEUED)
    assert job_runs.start_job(domain.store, other.id, "worker-1", lease_seconds=0)  # dies
    assert job_runs.start_job(domain.store, other.id, "worker-2")
    taken = domain.job(other.id)
    assert (taken.status, taken.lease_owner, taken.attempts) == (S.RUNNING, "worker-2", 2)


def test_a_cancel_its_dead_worker_left_is_carried_out(domain, job_of):
    job = job_of(S.QUEUED)
    assert job_runs.start_job(domain.store, job.id, "worker-1", lease_seconds=0)
    job_runs.record_progress(domain.store, job.id, 1, 0.0)
    jobs.cancel(domain.store, domain.acme.trainer, job.id)
    assert not job_runs.start_job(domain.store, job.id, "worker-2")  # carried out, not run
    ended = domain.job(job.id)
    assert ended.status == S.CANCELLED and ended.steps_done == 1
    assert ended.finished_at is not None and ended.lease_owner is None
    budget = files.retrieve(domain.store, domain.acme.owner, job.training_file_id).budget
    assert budget.spent > 0 and budget.committed == pytest.approx(budget.spent)  # settled
