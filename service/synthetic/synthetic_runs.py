"""Synthetic-data jobs, the worker's side: which are runnable, the lease, the histogram's
release (recorded before it is used), progress, and the end — the records as a data set of
their own with their provenance.

A job is runnable when queued and its source fine-tuning job has ended, or when running with
an expired lease (its worker died: the next attempt resumes). Every write below happens in one
transaction under the database's write lock and checks that the caller still holds the lease,
so two workers never both write, and a killed worker's job is taken over at the point its last
transaction left it: the histogram is drawn at most once (``privacy.released`` is written
before the labels are drawn from it), the records file resumes from its last batch
(:func:`dprc_core.synthetic.generate.synthesize`), the result data set is created in the same
transaction that ends the job.

The result is a fine-tune data set (``files.synthetic`` holds its provenance) in a budget group
of its own **without a budget**: it is post-processing of DP releases, so a job trained on it
charges no one, and no upload can join its group (no example hashes are recorded for it).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyLedger
from service.base.clock import now, utc_now
from service.base.ids import new_id
from service.budget import budget
from service.data.file_storage import storage_dir
from service.jobs.ledger_files import FORMAT, VERSION
from service.jobs.lifecycle import lease_expired
from service.store.db import locked_session
from service.store.job_status import TERMINAL, JobStatus
from service.store.ledger_folder import ensure_dir, ledger_path, write_atomic
from service.store.store import Store
from service.store.tables import BudgetGroup, File, SyntheticJob
from service.store.tables import Job as JobRow
from service.synthetic.synthetic_jobs import SYNTHETIC_PREFIX, add_event, privacy_summary

log = logging.getLogger(__name__)


def is_synthetic(job_id: str) -> bool:
    return job_id.startswith(SYNTHETIC_PREFIX + "-")


def ledger_record(row: SyntheticJob) -> dict[str, Any]:
    """The job's ledger file (the format of :mod:`service.jobs.ledger_files`): its one step is
    the label histogram's release, counted once drawn; a backup's manifest and ``dprc admin
    restore`` compare ``steps_done`` as for a job, so a histogram drawn after a backup freezes
    its data set when that backup is restored."""
    spent = budget.release_spent(row)
    planned = budget.release_planned(row)
    return {
        "format": FORMAT,
        "version": VERSION,
        "job_id": row.id,
        "tenant_id": row.tenant_id,
        "training_file": row.training_file_id,
        "budget_group": row.group_id,
        "status": row.status,
        "started_at": row.started_at,
        "updated_at": time.time(),
        "steps_total": 1 if planned is not None else 0,
        "steps_done": row.steps_done,
        "epsilon_spent": None,
        "delta": float((row.privacy or {}).get("delta") or 0.0),
        "ledger": json.loads(PrivacyLedger([spent] if spent is not None else []).to_json()),
        "planned": planned.to_dict() if planned is not None else None,
    }


def write_ledger(store: Store, job_id: str) -> None:
    """Rewrite the job's ledger file from the database (after a commit that changed it); a
    failure is logged (``dprc admin check`` reports the file that disagrees)."""
    try:
        with store.sessions() as session:
            row = session.scalar(select(SyntheticJob).where(SyntheticJob.id == job_id))
            if row is None:
                return
            record = ledger_record(row)
        ensure_dir(store.settings.data_dir)
        data = json.dumps(record, sort_keys=True, indent=1).encode()
        write_atomic(ledger_path(store.settings.data_dir, job_id), data)
    except Exception:  # noqa: BLE001 - the job goes on; the check reports the file
        log.exception("could not write the ledger file of synthetic data job %s", job_id)


def runnable(store: Store) -> list[str]:
    """Queued jobs whose fine-tuning job has ended, and running ones whose lease expired."""
    moment = utc_now()
    with store.sessions() as session:
        rows = session.execute(
            select(
                SyntheticJob.id, SyntheticJob.status, SyntheticJob.lease_expires_at, JobRow.status
            )
            .join(JobRow, JobRow.id == SyntheticJob.source_job_id)
            .where(
                or_(
                    SyntheticJob.status == JobStatus.QUEUED,
                    SyntheticJob.status == JobStatus.RUNNING,
                )
            )
            .order_by(SyntheticJob.seq)
        ).all()
    out = []
    for job_id, status, expires, source_status in rows:
        if status == JobStatus.QUEUED and JobStatus(source_status) in TERMINAL:
            out.append(job_id)
        elif status == JobStatus.RUNNING and lease_expired(expires, moment):
            out.append(job_id)
    return out


def waiting_on(store: Store, job_id: str) -> list[str]:
    """The queued synthetic-data jobs that wait for the fine-tuning job ``job_id``."""
    with store.sessions() as session:
        return list(
            session.scalars(
                select(SyntheticJob.id).where(
                    SyntheticJob.source_job_id == job_id,
                    SyntheticJob.status == JobStatus.QUEUED,
                )
            )
        )


@dataclass(frozen=True)
class Claimed:
    """What a worker needs to run the job."""

    id: str
    tenant_id: int
    model: str  # the source job's ft: model
    training_path: Path
    holdout_path: Path | None
    user_field: str | None  # the unit's field under user-level DP
    n: int
    spec: dict[str, Any]
    privacy: dict[str, Any]
    seed: int
    attempts: int


def _locked(session: Session, job_id: str) -> SyntheticJob | None:
    return session.scalar(select(SyntheticJob).where(SyntheticJob.id == job_id).with_for_update())


def _settle(session: Session, row: SyntheticJob) -> None:
    group = budget.lock_group(session, row.group_id)
    session.flush()
    budget.settle(session, group)


def claim(store: Store, job_id: str, owner: str, lease_seconds: int) -> Claimed | None:
    """Take the lease and mark the job running, or end it when its source job did not
    succeed; None when it is not runnable now (another live worker holds it, its source job is
    still running, or it ended)."""
    moment = utc_now()
    with locked_session(store.sessions) as session:
        row = _locked(session, job_id)
        if row is None or JobStatus(row.status) in TERMINAL:
            return None
        held = row.lease_owner not in (None, owner) and not lease_expired(
            row.lease_expires_at, moment
        )
        if row.status == JobStatus.RUNNING and held:
            return None
        if row.cancel_requested:
            _end(session, row, JobStatus.CANCELLED, "Synthetic data job cancelled")
            session.commit()
            return None
        source = session.scalar(select(JobRow).where(JobRow.id == row.source_job_id))
        assert source is not None
        if JobStatus(source.status) not in TERMINAL:
            return None
        if source.status != JobStatus.SUCCEEDED or not source.fine_tuned_model:
            _end(
                session,
                row,
                JobStatus.FAILED,
                f"its fine-tuning job {source.id} ended {source.status}",
                code="source_job_failed",
            )
            session.commit()
            return None
        train = session.scalar(select(File).where(File.id == row.training_file_id))
        assert train is not None
        holdout = None
        if row.holdout_file_id is not None:
            holdout = session.scalar(select(File).where(File.id == row.holdout_file_id))
        unit = source.privacy.get("unit") or {}
        row.status = JobStatus.RUNNING.value
        row.lease_owner = owner
        row.lease_expires_at = moment + timedelta(seconds=lease_seconds)
        row.started_at = row.started_at or now()
        row.attempts = row.attempts + 1
        add_event(row, f"Synthetic data job started (attempt {row.attempts})")
        session.commit()
        claimed = Claimed(
            id=row.id,
            tenant_id=row.tenant_id,
            model=str(source.fine_tuned_model),
            training_path=Path(train.storage_path),
            holdout_path=Path(holdout.storage_path)
            if holdout is not None and not holdout.deleted
            else None,
            user_field=str(unit["field"]) if unit.get("type") == "user" else None,
            n=row.n,
            spec=dict(row.spec),
            privacy=dict(row.privacy),
            seed=int(row.seed),
            attempts=row.attempts,
        )
    write_ledger(store, job_id)
    return claimed


def _held(session: Session, job_id: str, owner: str) -> SyntheticJob | None:
    row = _locked(session, job_id)
    if row is None or row.status != JobStatus.RUNNING or row.lease_owner != owner:
        return None
    return row


def renew(store: Store, job_id: str, owner: str, lease_seconds: int, records: int) -> bool:
    """Record the progress and extend the lease; False when the lease is lost or a
    cancellation was asked (the worker stops)."""
    with locked_session(store.sessions) as session:
        row = _held(session, job_id, owner)
        if row is None:
            return False
        if row.n and records * 10 // row.n > row.records_done * 10 // row.n and records < row.n:
            add_event(row, f"Generated {records:,} of {row.n:,} records")  # every tenth
        row.records_done = records
        row.lease_expires_at = utc_now() + timedelta(seconds=lease_seconds)
        cancel = row.cancel_requested
        session.commit()
        return not cancel


def release_histogram(
    store: Store, job_id: str, owner: str, histogram: dict[str, Any]
) -> dict[str, Any] | None:
    """Record the drawn histogram unless one was recorded before (then that one is returned
    and the new draw is discarded: a release is used, and charged, once). None when the lease
    is lost."""
    with locked_session(store.sessions) as session:
        row = _held(session, job_id, owner)
        if row is None:
            return None
        released = (row.privacy or {}).get("released")
        if released is not None:
            return dict(released)
        row.privacy = {**dict(row.privacy), "released": histogram}
        row.steps_done = 1
        sigma = histogram["noise_multiplier"]
        add_event(row, f"Released the label histogram (Gaussian noise, σ = {sigma:.4g})")
        _settle(session, row)
        session.commit()
    write_ledger(store, job_id)
    return histogram


def _end(
    session: Session, row: SyntheticJob, status: JobStatus, message: str, code: str | None = None
) -> None:
    row.status = status.value
    row.finished_at = now()
    row.lease_owner = None
    if code is not None:
        row.error_code = code
        row.error_message = message
    add_event(row, message, level="error" if status == JobStatus.FAILED else "info")
    _settle(session, row)


def end(
    store: Store, job_id: str, owner: str, status: JobStatus, message: str, code: str | None = None
) -> bool:
    """End a running job (failed or cancelled) the caller holds."""
    with locked_session(store.sessions) as session:
        row = _held(session, job_id, owner)
        if row is None:
            return False
        _end(session, row, status, message, code)
        session.commit()
    write_ledger(store, job_id)
    return True


def succeed(
    store: Store, job_id: str, owner: str, records: Path, report: dict[str, Any] | None
) -> str | None:
    """End the job: its records become a data set of their own (a copy in the tenant's
    storage, a group without a budget, the provenance in ``files.synthetic``), in the same
    transaction. Returns the file's id; None when the lease is lost."""
    with locked_session(store.sessions) as session:
        row = _held(session, job_id, owner)
        if row is None:
            return None
        target = storage_dir(store, row.tenant_id) / f"{row.id}.jsonl"
        shutil.copyfile(records, target)  # the same name on every attempt: never a stray copy
        epsilon, unit, events = privacy_summary(session, row)
        source = session.scalar(select(JobRow).where(JobRow.id == row.source_job_id))
        assert source is not None
        provenance = {
            "synthetic_job": row.id,
            "source_budget_group": row.group_id,
            "source_training_file": row.training_file_id,
            "fine_tuning_job": row.source_job_id,
            "model": source.fine_tuned_model,
            "privacy_unit": unit,
            "epsilon": epsilon,
            "delta": row.privacy.get("delta"),
            "events": events,
            "labels": row.spec.get("labels", {}).get("type"),
            "download_roles": list(row.spec.get("download_roles") or []),
        }
        group = BudgetGroup(
            id=new_id("bg"),
            tenant_id=row.tenant_id,
            created_at=now(),
            n_examples=row.n,
            epsilon_budget=None,
            delta=None,
            epsilon_spent=0.0,
            epsilon_committed=0.0,
            privacy_unit="example",
        )
        session.add(group)
        session.flush()
        file = File(
            id=new_id("file"),
            tenant_id=row.tenant_id,
            filename=f"{row.id}.jsonl",
            purpose="fine-tune",
            bytes=target.stat().st_size,
            created_at=now(),
            storage_path=str(target),
            n_examples=row.n,
            data_format=str(row.spec["format"]),
            group_id=group.id,
            unbudgeted=False,
            deleted=False,
            created_by=row.created_by,
            synthetic=provenance,
        )
        session.add(file)
        session.flush()
        row.result_file_id = file.id
        row.records_done = row.n
        row.report = report
        row.privacy = {**dict(row.privacy), "epsilon": epsilon, "events": events}
        eps_text = "no finite bound" if epsilon is None else f"ε = {epsilon:.4g}"
        _end(
            session,
            row,
            JobStatus.SUCCEEDED,
            f"Wrote {row.n} records to file {file.id} ({eps_text} at δ = "
            f"{row.privacy.get('delta'):.3g} for each {unit}, composed)",
        )
        session.commit()
        file_id = file.id
    write_ledger(store, job_id)
    return file_id
