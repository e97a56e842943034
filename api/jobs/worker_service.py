"""Worker-side queries on the job store: what a worker needs to run a job, lease renewal and
the sweep that finds jobs to (re)start. The job's row is the truth; the queue carries ids."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select

from api.common import Store, now
from api.db import locked_session
from api.tables import File
from api.tables import Job as JobRow


@dataclass(frozen=True)
class JobRequest:
    """A job as the worker runs it (copied out of the row under no lock)."""

    id: str
    tenant_id: int
    model: str
    file_path: Path
    n_examples: int
    hyperparameters: dict[str, Any]
    privacy: dict[str, Any]
    seed: int
    checkpoint_every: int | None
    noise_multiplier: float
    sample_rate: float
    steps_total: int


def job_request(store: Store, job_id: str) -> JobRequest:
    with store.sessions() as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        if job is None:
            raise LookupError(f"no such job {job_id}")
        file = session.scalar(select(File).where(File.id == job.training_file_id))
        assert file is not None
        return JobRequest(
            id=job.id, tenant_id=job.tenant_id, model=job.model,
            file_path=Path(file.storage_path), n_examples=int(file.n_examples or 0),
            hyperparameters=dict(job.hyperparameters), privacy=dict(job.privacy),
            seed=int(job.seed), checkpoint_every=job.checkpoint_every,
            noise_multiplier=job.noise_multiplier, sample_rate=job.sample_rate,
            steps_total=job.steps_total,
        )


def _aware(moment: datetime | None) -> datetime | None:
    if moment is not None and moment.tzinfo is None:  # SQLite returns naive datetimes
        return moment.replace(tzinfo=UTC)
    return moment


def renew_lease(store: Store, job_id: str, owner: str, lease_seconds: int) -> bool:
    """Extend ``owner``'s lease; False when the job is no longer running under that owner
    (another worker took it over, or it ended)."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
        if job is None or job.status != "running" or job.lease_owner != owner:
            return False
        moment = datetime.now(UTC)
        job.heartbeat_at = moment
        job.lease_expires_at = moment + timedelta(seconds=lease_seconds)
        session.commit()
        return True


def cancel_requested(store: Store, job_id: str) -> bool:
    with store.sessions() as session:
        flag = session.scalar(select(JobRow.cancel_requested).where(JobRow.id == job_id))
        return bool(flag)


def stop_requested(store: Store, job_id: str) -> tuple[bool, bool]:
    """(cancel requested, pause requested)."""
    with store.sessions() as session:
        row = session.execute(select(JobRow.cancel_requested, JobRow.pause_requested).where(
            JobRow.id == job_id)).one_or_none()
        return (bool(row[0]), bool(row[1])) if row else (True, False)


def runnable_job_ids(store: Store, queued_older_than: int = 0) -> list[str]:
    """Jobs a worker should (re)start: queued ones (created at least ``queued_older_than``
    seconds ago) and running ones whose lease expired (their worker died)."""
    moment = datetime.now(UTC)
    with store.sessions() as session:
        rows = session.execute(
            select(JobRow.id, JobRow.status, JobRow.lease_expires_at, JobRow.created_at).where(
                or_(JobRow.status == "queued", JobRow.status == "running")
            ).order_by(JobRow.seq)
        ).all()
    out = []
    for job_id, status, expires, created in rows:
        if status == "queued" and now() - created >= queued_older_than:
            out.append(job_id)
        elif status == "running":
            expires = _aware(expires)
            if expires is None or expires <= moment:
                out.append(job_id)
    return out
