"""Privacy budgets of data sets: the composition of every job's privacy events on a file.

A job on a file contributes its **planned** event (σ, q, all planned steps) while it is active
(validating, queued, running) — that is its reservation — and the event of the steps that
actually ran once it has ended (its settlement). The budget check composes all of them with the
PLD accountant (``epsilon_for_events``) under a lock on the file row; ε's are never added.
"""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.tables import File, Job
from dprc_core.accounting import PrivacyEvent, epsilon_for_events

ACTIVE = ("validating_files", "queued", "running", "paused")
TERMINAL = ("succeeded", "failed", "cancelled")


def _event(job: Job, steps: int) -> PrivacyEvent | None:
    if steps <= 0:
        return None
    noise = (job.privacy or {}).get("noise") or {}
    if noise.get("mechanism") == "nu_dpftrl":
        from api.jobs.planning import nu_dpftrl_event

        return nu_dpftrl_event(job.noise_multiplier, steps, noise)
    return PrivacyEvent(
        noise_multiplier=job.noise_multiplier,
        sample_rate=job.sample_rate,
        steps=steps,
        clipping=job.accounting_clipping,
        k=job.accounting_k,
    )


def planned_event(job: Job) -> PrivacyEvent:
    event = _event(job, job.steps_total)
    assert event is not None
    return event


def spent_event(job: Job) -> PrivacyEvent | None:
    """The steps that ran (the worker counts a step as soon as it starts)."""
    return _event(job, job.steps_done)


def committed_event(job: Job) -> PrivacyEvent | None:
    """A job's share of its file's budget: its whole plan while active, what ran once ended."""
    return planned_event(job) if job.status in ACTIVE else spent_event(job)


def compose(events: list[PrivacyEvent | None], delta: float) -> float:
    """ε of the composition; +inf (fits no budget) when the accountant cannot bound it."""
    present = [e for e in events if e is not None]
    if not present:
        return 0.0
    try:
        return epsilon_for_events(present, delta)
    except ValueError:
        return math.inf


def lock_file(session: Session, tenant_id: int, file_id: str) -> File | None:
    """The tenant's file, its row locked for the rest of the transaction (FOR UPDATE on
    PostgreSQL; on SQLite the caller's transaction began with BEGIN IMMEDIATE)."""
    return session.scalar(
        select(File)
        .where(File.id == file_id, File.tenant_id == tenant_id, File.deleted.is_(False))
        .with_for_update()
    )


def file_jobs(session: Session, file_id: str) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.training_file_id == file_id)))


def refresh(session: Session, file: File, extra: PrivacyEvent | None = None) -> tuple[float, float]:
    """Recompute (spent, committed) ε of a budgeted file at its δ, with ``extra`` (a job about
    to be created) counted as committed; stores them on the row. Call under the file's lock."""
    if file.delta is None:
        return 0.0, 0.0
    jobs = file_jobs(session, file.id)
    spent = compose([spent_event(j) for j in jobs], file.delta)
    committed = compose([committed_event(j) for j in jobs] + [extra], file.delta)
    file.epsilon_spent = spent
    file.epsilon_committed = committed
    return spent, committed


def check_delta_for(n: int, delta: float, param: str) -> float:
    from api.errors import InvalidRequest

    if not 0 < delta <= 1 / n:
        raise InvalidRequest(
            f"{param}={delta:g} is above 1/N = {1 / n:g} for this data set of {n} examples; "
            "such a delta would allow releasing whole examples",
            param=param,
            code="invalid_delta",
        )
    return delta
