"""A job's lifecycle: the moves between its statuses (:mod:`service.store.job_status`) and who makes
each, the one function that moves a job (:func:`move`), leases, and the budget settlement a
move triggers (:func:`service.budget.budget.settle`).

The HTTP side (create, cancel, pause, resume) and the workers (start, end, pause at a
checkpoint, lease renewal) both go through this module; neither knows the other.

Locks: :func:`move` and :func:`renew_lease` run in one transaction that holds the database
write lock from its start on SQLite (BEGIN IMMEDIATE) and, on PostgreSQL, locks the job's row
with SELECT ... FOR UPDATE — after its file's row when the move settles the budget, in the
order job creation uses (tenant, file, then the job).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.base.clock import aware, now, utc_now
from service.base.errors import Conflict, NotFound
from service.budget import budget
from service.budget.budget import settle
from service.data.private_data import remove_resume_state
from service.jobs.job_events import add_event
from service.jobs.retention import remove_retired_checkpoints, retire_old_checkpoints
from service.store.db import locked_session
from service.store.job_status import ACTIVE, TERMINAL, JobStatus
from service.store.store import Store
from service.store.tables import BudgetGroup, File
from service.store.tables import Job as JobRow


class Actor(StrEnum):
    CLIENT = "client"  # the HTTP API, on a tenant's request
    WORKER = "worker"  # the worker that holds (or takes) the job's lease


class WorkerOutcome(StrEnum):
    """What one worker attempt at a job ended with (:func:`worker.execution.execute_job`)."""

    SKIPPED = "skipped"  # not runnable, or a live lease elsewhere
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # shutdown: left running, its lease will expire
    LEASE_LOST = "lease_lost"  # another worker took the job over


S = JobStatus
# The allowed moves, (from, to) -> who makes them. RUNNING -> RUNNING is a worker taking over
# a job whose lease expired. Nothing enters VALIDATING_FILES (creation validates the file and
# reserves the budget before it answers); the status stays in the API's vocabulary.
TRANSITIONS: dict[tuple[JobStatus, JobStatus], Actor] = {
    (S.VALIDATING_FILES, S.CANCELLED): Actor.CLIENT,
    (S.QUEUED, S.RUNNING): Actor.WORKER,
    (S.QUEUED, S.PAUSED): Actor.CLIENT,
    (S.QUEUED, S.CANCELLED): Actor.CLIENT,
    (S.PAUSED, S.QUEUED): Actor.CLIENT,
    (S.PAUSED, S.CANCELLED): Actor.CLIENT,
    (S.RUNNING, S.RUNNING): Actor.WORKER,
    (S.RUNNING, S.PAUSED): Actor.WORKER,
    (S.RUNNING, S.SUCCEEDED): Actor.WORKER,
    (S.RUNNING, S.FAILED): Actor.WORKER,
    (S.RUNNING, S.CANCELLED): Actor.WORKER,
}


@dataclass(frozen=True)
class Deferral:
    """A client's move that the job's worker makes: the client records a request (``flag``)
    and the worker stops after the current step and moves the job."""

    flag: str
    message: str
    refused_if: str | None = None  # another pending request that rules this one out


DEFERRED: dict[tuple[JobStatus, JobStatus], Deferral] = {
    (S.RUNNING, S.CANCELLED): Deferral(
        "cancel_requested", "Cancellation requested; the worker stops after the current step"
    ),
    (S.RUNNING, S.PAUSED): Deferral(
        "pause_requested",
        "Pause requested; the worker stops after the current step and writes a checkpoint",
        refused_if="cancel_requested",
    ),
}

# Moves a client may ask for again: the job comes back as it is.
REPEATABLE = frozenset({S.CANCELLED, S.PAUSED})

# Why a client's move is refused, by its target: (code, message given the job).
REFUSALS: dict[JobStatus, tuple[str, str]] = {
    S.CANCELLED: ("job_not_cancellable", "fine-tuning job {id} has already {status}"),
    S.PAUSED: ("job_not_pausable", "fine-tuning job {id} is {status} and cannot be paused"),
    S.QUEUED: ("job_not_paused", "fine-tuning job {id} is {status}, not paused"),
}
del S


class TransitionRefused(Conflict):
    """The job's status does not allow the move."""

    def __init__(self, job: JobRow, target: JobStatus):
        code, template = REFUSALS.get(
            target,
            (
                "invalid_transition",
                f"fine-tuning job {{id}} is {{status}}: cannot move to {target.value}",
            ),
        )
        super().__init__(
            template.format(id=job.id, status=job.status), param="fine_tuning_job_id", code=code
        )
        self.status = JobStatus(job.status)
        self.target = target


def settles(source: JobStatus, target: JobStatus) -> bool:
    """Whether the move changes the job's share of its data set's budget (reservation vs what
    ran), so the budget group's totals must be recomputed."""
    return (source in ACTIVE) != (target in ACTIVE)


def _lock(
    session: Session, job_id: str, tenant_id: int | None, with_file: bool
) -> tuple[JobRow, BudgetGroup | None]:
    """The job (of ``tenant_id`` when given) with its row locked, after its training file's
    budget group's row when ``with_file``. A job's file and a file's group never change, so
    reading them before the locks is safe."""
    query = select(JobRow.training_file_id).where(JobRow.id == job_id)
    if tenant_id is not None:
        query = query.where(JobRow.tenant_id == tenant_id)
    file_id = session.scalar(query)
    if file_id is None:
        raise NotFound(
            f"no such fine-tuning job: {job_id[:64]!r}",
            param="fine_tuning_job_id",
            code="job_not_found",
        )
    group = None
    if with_file:
        group_id = session.scalar(select(File.group_id).where(File.id == file_id))
        group = budget.lock_group(session, group_id) if group_id is not None else None
    job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
    assert job is not None
    return job, group


def move(
    store: Store,
    job_id: str,
    target: JobStatus,
    *,
    by: Actor,
    message: str,
    tenant_id: int | None = None,
    level: str = "info",
    guard: Callable[[JobRow], bool] | None = None,
    on_change: Callable[[Session, JobRow], None] | None = None,
    **changes: Any,
) -> JobRow | None:
    """Move ``job_id`` to ``target`` on behalf of ``by``, in one locked transaction: check the
    move is allowed, set the status and ``changes`` (column values, or functions of the locked
    row giving them), log ``message`` (a format string over ``job``) as a job event and settle
    the file's budget when the move requires it (:func:`settles`).

    * Already in ``target`` (a client's repeated cancel or pause): nothing changes.
    * A client's move that the worker makes (:data:`DEFERRED`): the request is recorded.
    * ``guard`` (worker-side conditions such as the lease) false: nothing changes, None.
    * ``on_change(session, job)`` runs last in the transaction when the move or the request
      is recorded (the audit entry of a client's act).

    Returns the job's row as committed. Raises :class:`NotFound` (no such job of the tenant)
    and :class:`TransitionRefused`.
    """
    with locked_session(store.sessions) as session:
        job, group = _lock(session, job_id, tenant_id, with_file=target in TERMINAL)
        source = JobStatus(job.status)
        if guard is not None and not guard(job):
            return None
        if by is Actor.CLIENT and source == target and target in REPEATABLE:
            return job
        deferral = DEFERRED.get((source, target)) if by is Actor.CLIENT else None
        if deferral is not None:
            if deferral.refused_if and getattr(job, deferral.refused_if):
                raise TransitionRefused(job, target)
            if not getattr(job, deferral.flag):
                setattr(job, deferral.flag, True)
                add_event(session, job.id, deferral.message)
                if on_change is not None:
                    on_change(session, job)
                session.commit()
            return job
        if TRANSITIONS.get((source, target)) is not by:
            raise TransitionRefused(job, target)
        job.status = target.value
        for column, value in changes.items():
            setattr(job, column, value(job) if callable(value) else value)
        add_event(session, job.id, message.format(job=job), level=level)
        if settles(source, target) and group is not None:
            settle(session, group)
        if on_change is not None:
            on_change(session, job)
        if target in TERMINAL:  # DPRC_KEEP_CHECKPOINTS (off by default), with the job's end
            retire_old_checkpoints(session, store.settings.keep_checkpoints, job_id)
        session.commit()
    if target in TERMINAL:  # an ended job is never resumed: its seed and RNG states go
        remove_resume_state(store.settings.data_dir, job_id)
        remove_retired_checkpoints(store, job_id)
    return job


# -- leases -----------------------------------------------------------------------------------


def carry_out_abandoned_request(store: Store, job_id: str, moment: datetime) -> bool:
    """A running job whose worker died (its lease expired) with a client's cancel or pause
    still pending: the request is carried out now, by whoever finds the job, as the dead
    worker would have — cancelled (the reservation settled to the steps that ran,
    ``steps_done``, counted when each step started) or paused (the reservation kept, resumable
    from its last checkpoint). A pending cancel wins over a pause. True if it moved the job.

    The (status, pending request, lease) combinations and their outcomes:

    ========  =========  ==========  ==============================================
    status    pending    lease       outcome
    ========  =========  ==========  ==============================================
    running   none       live        its worker runs on
    running   none       expired     a worker takes it over and resumes (:func:`claim`)
    running   cancel     live        its worker stops after the step: cancelled
    running   cancel     expired     cancelled here, settled to ``steps_done``
    running   pause      live        its worker stops at a checkpoint: paused
    running   pause      expired     paused here, reservation kept
    queued    —          none        cancel and pause apply at once (not deferred)
    paused    —          none        resume queues it; cancel ends it at once
    ========  =========  ==========  ==============================================
    """

    def abandoned(job: JobRow, flag: str) -> bool:
        return (
            job.status == JobStatus.RUNNING
            and bool(getattr(job, flag))
            and lease_expired(job.lease_expires_at, moment)
        )

    try:
        cancelled = move(
            store,
            job_id,
            JobStatus.CANCELLED,
            by=Actor.WORKER,
            guard=lambda job: abandoned(job, "cancel_requested"),
            message="Job cancelled at step {job.steps_done} (its worker stopped before it "
            "could act on the cancellation)",
            finished_at=now(),
            lease_owner=None,
            lease_expires_at=None,
        )
        if cancelled is not None:
            return True
        paused = move(
            store,
            job_id,
            JobStatus.PAUSED,
            by=Actor.WORKER,
            guard=lambda job: abandoned(job, "pause_requested"),
            message="Job paused at step {job.steps_done} (its worker stopped before it could "
            "act on the pause; it resumes from its last checkpoint)",
            pause_requested=False,
            lease_owner=None,
            lease_expires_at=None,
        )
    except NotFound:
        return False
    return paused is not None


def claim(
    store: Store, job_id: str, owner: str, lease_seconds: int, devices: int = 1, nodes: int = 1
) -> bool:
    """Take the lease on a queued job, or on a running one whose lease expired (its worker
    died), and mark it running. False if another live worker holds it, a cancellation or
    pause is pending (an abandoned one is carried out first:
    :func:`carry_out_abandoned_request`), the job needs more than the worker's ``devices``
    (a one-host job: the worker's own) or ``nodes`` (the hosts it can launch on through Ray),
    or the job is not runnable."""
    moment = utc_now()
    if carry_out_abandoned_request(store, job_id, moment):
        return False

    def claimable(job: JobRow) -> bool:
        if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING) or job.cancel_requested:
            return False
        if job.nodes > nodes:  # a worker that launches on enough hosts takes it
            return False
        if job.nodes == 1 and job.devices > devices:  # another with enough devices takes it
            return False
        held_elsewhere = job.lease_owner not in (None, owner)
        return not (
            job.status == JobStatus.RUNNING
            and held_elsewhere
            and not lease_expired(job.lease_expires_at, moment)
        )

    try:
        row = move(
            store,
            job_id,
            JobStatus.RUNNING,
            by=Actor.WORKER,
            guard=claimable,
            message="Job started (attempt {job.attempts})",
            lease_owner=owner,
            heartbeat_at=moment,
            lease_expires_at=moment + timedelta(seconds=lease_seconds),
            started_at=lambda job: job.started_at or now(),
            attempts=lambda job: job.attempts + 1,
        )
    except NotFound:
        return False
    return row is not None


def renew_lease(store: Store, job_id: str, owner: str, lease_seconds: int) -> bool:
    """Extend ``owner``'s lease; False when the job is no longer running under that owner
    (another worker took it over, or it ended)."""

    def renew(job: JobRow) -> None:
        moment = utc_now()
        job.heartbeat_at = moment
        job.lease_expires_at = moment + timedelta(seconds=lease_seconds)

    return _with_held_lease(store, job_id, owner, renew)


def release_lease(store: Store, job_id: str, owner: str) -> bool:
    """End ``owner``'s lease now (the job stays running): the next sweep starts a new attempt,
    which resumes from the last checkpoint. False if ``owner`` no longer holds it."""

    def release(job: JobRow) -> None:
        job.lease_owner = None
        job.lease_expires_at = utc_now()

    return _with_held_lease(store, job_id, owner, release)


def _with_held_lease(
    store: Store, job_id: str, owner: str, change: Callable[[JobRow], None]
) -> bool:
    """Apply ``change`` to the job under its row lock if it is running under ``owner``."""
    with locked_session(store.sessions) as session:
        try:
            job, _ = _lock(session, job_id, None, with_file=False)
        except NotFound:
            return False
        if job.status != JobStatus.RUNNING or job.lease_owner != owner:
            return False
        change(job)
        session.commit()
        return True


def lease_expired(expires_at: datetime | None, moment: datetime) -> bool:
    expires = aware(expires_at)
    return expires is None or expires <= moment


def runnable_job_ids(store: Store, queued_older_than: int = 0) -> list[str]:
    """Jobs a worker should (re)start: queued ones (created at least ``queued_older_than``
    seconds ago) and running ones whose lease expired (their worker died)."""
    return [job_id for job_id, _, _ in runnable_jobs(store, queued_older_than)]


def runnable_jobs(store: Store, queued_older_than: int = 0) -> list[tuple[str, int, int]]:
    """(job id, devices, nodes) of :func:`runnable_job_ids`' jobs, in submission order."""
    moment = utc_now()
    with store.sessions() as session:
        rows = session.execute(
            select(
                JobRow.id,
                JobRow.status,
                JobRow.lease_expires_at,
                JobRow.created_at,
                JobRow.devices,
                JobRow.nodes,
            )
            .where(or_(JobRow.status == JobStatus.QUEUED, JobRow.status == JobStatus.RUNNING))
            .order_by(JobRow.seq)
        ).all()
    out = []
    for job_id, status, expires, created, devices, nodes in rows:
        if status == JobStatus.QUEUED and now() - created >= queued_older_than:
            out.append((job_id, devices, nodes))
        elif status == JobStatus.RUNNING and lease_expired(expires, moment):
            out.append((job_id, devices, nodes))
    return out


def stop_requested(store: Store, job_id: str) -> tuple[bool, bool]:
    """(cancel requested, pause requested): the client's deferred moves, read by the worker
    between steps. A job that is gone reads as cancelled."""
    with store.sessions() as session:
        row = session.execute(
            select(JobRow.cancel_requested, JobRow.pause_requested).where(JobRow.id == job_id)
        ).one_or_none()
        return (bool(row[0]), bool(row[1])) if row else (True, False)
