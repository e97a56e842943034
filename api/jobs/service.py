"""Job creation (plan, budget reservation, idempotency, limits), reads, cancellation, and the
transitions a worker uses (checkpoints, settlement)."""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.common import Store, cursor_page, new_id, now
from api.db import locked_session
from api.errors import Conflict, InvalidRequest, NotFound, RateLimited
from api.files import budget
from api.files import service as files
from api.jobs import planning
from api.jobs.schemas import Checkpoint as CheckpointObject
from api.jobs.schemas import Event, Job, JobCreate, JobError, Ledger
from api.keys.service import Caller
from api.models import service as models
from api.tables import Checkpoint, File, IdempotencyKey, JobEvent, Tenant
from api.tables import Job as JobRow
from dprc_core.accounting import PrivacyLedger

FORMATS_FOR_TASK = {"causal_lm": ("text", "chat"), "classification": ("classification",)}


# -- objects ----------------------------------------------------------------------------------


def to_object(row: JobRow, caller_org: str) -> Job:
    privacy = dict(row.privacy)
    privacy["epsilon_spent"] = row.epsilon_spent
    error = None
    if row.error_code or row.error_message:
        error = JobError(code=row.error_code or "error", message=row.error_message or "")
    return Job(
        id=row.id, created_at=row.created_at, error=error, fine_tuned_model=row.fine_tuned_model,
        finished_at=row.finished_at, hyperparameters=row.hyperparameters, model=row.model,
        organization_id=caller_org, result_files=list(row.result_files or []), seed=row.seed,
        status=row.status, trained_tokens=row.trained_tokens, training_file=row.training_file_id,
        metadata=row.job_metadata, user_provided_suffix=row.suffix, privacy=privacy,
        steps_done=row.steps_done, steps_total=row.steps_total,
        checkpoint_every=row.checkpoint_every, cancel_requested=row.cancel_requested,
        pause_requested=bool(row.pause_requested),
    )


def _org(caller: Caller) -> str:
    return f"org-{caller.tenant_id}"


def add_event(session: Session, job_id: str, message: str, *, level: str = "info",
              type_: str = "message", data: dict[str, Any] | None = None) -> None:
    session.add(JobEvent(id=new_id("ftevent"), job_id=job_id, created_at=now(), level=level,
                         type=type_, message=message, data=data))


def _request_hash(req: JobCreate) -> str:
    body = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _idempotent(session: Session, caller: Caller, key: str, digest: str) -> JobRow | None:
    row = session.scalar(select(IdempotencyKey).where(
        IdempotencyKey.tenant_id == caller.tenant_id, IdempotencyKey.key == key))
    if row is None:
        return None
    if row.request_hash != digest:
        raise Conflict("this Idempotency-Key was already used with a different request",
                       param="Idempotency-Key", code="idempotency_key_reused")
    job = session.scalar(select(JobRow).where(JobRow.id == row.job_id))
    assert job is not None
    return job


# -- create -----------------------------------------------------------------------------------


def create_job(store: Store, caller: Caller, req: JobCreate, idempotency_key: str | None) -> Job:
    digest = _request_hash(req)
    if idempotency_key is not None:
        with store.sessions() as session:
            existing = _idempotent(session, caller, idempotency_key, digest)
            if existing is not None:
                return to_object(existing, _org(caller))

    model = models.get_model(store.settings, req.model)
    with store.sessions() as session:
        file = session.scalar(select(File).where(
            File.id == req.training_file, File.tenant_id == caller.tenant_id,
            File.deleted.is_(False)))
        if file is None:
            raise NotFound(f"no such file: {req.training_file[:64]!r}", param="training_file",
                           code="file_not_found")
        if file.purpose != "fine-tune" or file.n_examples is None:
            raise InvalidRequest(f"file {file.id} is not a fine-tune data set",
                                 param="training_file", code="invalid_file")
        n, fmt = file.n_examples, file.data_format
    if fmt not in FORMATS_FOR_TASK[model.task]:
        raise InvalidRequest(
            f"model {model.name!r} ({model.task}) needs lines of format "
            f"{' or '.join(FORMATS_FOR_TASK[model.task])}; file {req.training_file} is {fmt}",
            param="training_file", code="invalid_file")
    plan = planning.make_plan(req, n, store.settings.default_k)
    models.ensure_local(model)  # builds the built-in tiny LM on first use
    new_event = plan.event()

    with locked_session(store.sessions) as session:
        # lock order: tenant row, then file row (FOR UPDATE on PostgreSQL; BEGIN IMMEDIATE on
        # SQLite holds the write lock for the whole transaction)
        session.get(Tenant, caller.tenant_id, with_for_update=True)
        if idempotency_key is not None:
            existing = _idempotent(session, caller, idempotency_key, digest)
            if existing is not None:
                return to_object(existing, _org(caller))
        file = budget.lock_file(session, caller.tenant_id, req.training_file)
        if file is None:
            raise NotFound(f"no such file: {req.training_file[:64]!r}", param="training_file",
                           code="file_not_found")
        active = session.scalar(select(func.count()).select_from(JobRow).where(
            JobRow.tenant_id == caller.tenant_id, JobRow.status.in_(budget.ACTIVE))) or 0
        limit = store.settings.max_active_jobs_per_tenant
        if active >= limit:
            raise RateLimited(f"too many active fine-tuning jobs ({active}, limit {limit}); "
                              "wait for one to end or cancel one", code="too_many_active_jobs")
        if file.epsilon_budget is not None and file.delta is not None:
            spent, committed = budget.refresh(session, file, extra=new_event)
            if committed > file.epsilon_budget:
                _before, current = budget.refresh(session, file)
                session.rollback()
                remaining = max(0.0, file.epsilon_budget - current)
                raise Conflict(
                    f"privacy budget of file {file.id} exceeded: budget epsilon="
                    f"{file.epsilon_budget:g} at delta={file.delta:g}; already committed "
                    f"epsilon={current:.4g} (spent {spent:.4g}); remaining epsilon="
                    f"{remaining:.4g}; this job (planned epsilon={plan.planned_epsilon:.4g} at "
                    f"its delta={plan.target_delta:g}) would bring the composed epsilon to "
                    f"{committed:.4g}", param="training_file", code="budget_exceeded")
        row = _insert_job(session, caller, req, plan)
        if idempotency_key is not None:
            session.add(IdempotencyKey(tenant_id=caller.tenant_id, key=idempotency_key,
                                       request_hash=digest, job_id=row.id, created_at=now()))
        session.commit()
        return to_object(row, _org(caller))


def _insert_job(session: Session, caller: Caller, req: JobCreate, plan: planning.Plan) -> JobRow:
    hp = req.hyperparameters
    lrm = hp.learning_rate_multiplier
    hyper = {
        "n_epochs": plan.n_epochs,
        "batch_size": plan.batch_size,
        "learning_rate_multiplier": None if hp.learning_rate is not None
        else (1.0 if lrm in (None, "auto") else lrm),
        "learning_rate": hp.learning_rate,
        "max_seq_len": hp.max_seq_len,
        "lora": hp.lora.model_dump() if hp.lora else None,
        "train_only": hp.train_only,
    }
    pr = req.privacy
    privacy = {
        "target_epsilon": pr.target_epsilon,
        "target_delta": plan.target_delta,
        "max_grad_norm": pr.max_grad_norm,
        "clipping": {"method": plan.method, "k": plan.k},
        "noise": plan.noise(),
        "report_train_loss": pr.report_train_loss,
        "dataset_size": plan.n_examples,
        "sample_rate": plan.sample_rate,
        "steps": plan.steps,
        "noise_multiplier": plan.noise_multiplier,
        "planned_epsilon": plan.planned_epsilon,
        "accountant": plan.accountant(),
    }
    row = JobRow(
        id=new_id("ftjob"), tenant_id=caller.tenant_id, model=req.model,
        training_file_id=req.training_file, status="queued", created_at=now(),
        hyperparameters=hyper, privacy=privacy,
        seed=req.seed if req.seed is not None else secrets.randbits(63),  # secret: 63 bits
        suffix=req.suffix, job_metadata=req.metadata, checkpoint_every=req.checkpoint_every,
        noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
        steps_total=plan.steps, accounting_clipping=plan.accounting_clipping,
        accounting_k=plan.accounting_k, steps_done=0, epsilon_spent=0.0, result_files=[],
        cancel_requested=False, attempts=0,
    )
    session.add(row)
    session.flush()
    add_event(session, row.id, f"Created fine-tuning job: {row.id}")
    add_event(session, row.id,
              f"Privacy plan: noise multiplier {plan.noise_multiplier:.4g}, sample rate "
              f"{plan.sample_rate:.4g}, {plan.steps} steps, planned epsilon "
              f"{plan.planned_epsilon:.4g} at delta {plan.target_delta:g}",
              data={"noise_multiplier": plan.noise_multiplier, "sample_rate": plan.sample_rate,
                    "steps": plan.steps, "planned_epsilon": plan.planned_epsilon,
                    "target_delta": plan.target_delta})
    add_event(session, row.id, "Job queued")
    return row


# -- reads ------------------------------------------------------------------------------------


def get_row(session: Session, caller: Caller, job_id: str) -> JobRow:
    row = session.scalar(select(JobRow).where(JobRow.id == job_id,
                                              JobRow.tenant_id == caller.tenant_id))
    if row is None:
        raise NotFound(f"no such fine-tuning job: {job_id[:64]!r}", param="fine_tuning_job_id",
                       code="job_not_found")
    return row


def retrieve(store: Store, caller: Caller, job_id: str) -> Job:
    with store.sessions() as session:
        return to_object(get_row(session, caller, job_id), _org(caller))


def list_jobs(
    store: Store, caller: Caller, after: str | None, limit: int
) -> tuple[list[Job], bool]:
    with store.sessions() as session:
        q = select(JobRow).where(JobRow.tenant_id == caller.tenant_id)
        rows, more = cursor_page(session, q, JobRow, after, limit, "job")
        return [to_object(r, _org(caller)) for r in rows], more


def list_events(store: Store, caller: Caller, job_id: str, after: str | None,
                limit: int) -> tuple[list[Event], bool]:
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        q = select(JobEvent).where(JobEvent.job_id == job.id)
        rows, more = cursor_page(session, q, JobEvent, after, limit, "event")
        data = [Event(id=r.id, created_at=r.created_at, level=r.level, message=r.message,
                      type=r.type, data=r.data) for r in rows]
        return data, more


def list_checkpoints(store: Store, caller: Caller, job_id: str, after: str | None,
                     limit: int) -> tuple[list[CheckpointObject], bool]:
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        q = select(Checkpoint).where(Checkpoint.job_id == job.id)
        rows, more = cursor_page(session, q, Checkpoint, after, limit, "checkpoint")
        data = [CheckpointObject(
            id=r.id, created_at=r.created_at,
            fine_tuned_model_checkpoint=f"ft:{job.model}:{job.suffix or ''}:{job.id}:"
                                        f"ckpt-step-{r.step}",
            fine_tuning_job_id=job.id, metrics={"step": r.step, **(r.metrics or {})},
            step_number=r.step, epsilon=r.epsilon, file_id=r.file_id) for r in rows]
        return data, more


def ledger(store: Store, caller: Caller, job_id: str) -> Ledger:
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        spent = budget.spent_event(job)
        led = PrivacyLedger([spent] if spent is not None else [])
        delta = float(job.privacy["target_delta"])
        return Ledger(job_id=job.id, delta=delta, epsilon_spent=led.epsilon(delta),
                      ledger=json.loads(led.to_json()),
                      planned=budget.planned_event(job).to_dict())


# -- transitions ------------------------------------------------------------------------------


def cancel(store: Store, caller: Caller, job_id: str) -> Job:
    """Queued jobs end now (their reservation is released); a running job is asked to stop
    and its worker ends it, settling to the steps that ran."""
    with store.sessions() as session:
        file_id = get_row(session, caller, job_id).training_file_id
    with locked_session(store.sessions) as session:
        file = session.scalar(select(File).where(File.id == file_id).with_for_update())
        job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
        assert job is not None and file is not None
        if job.status in ("succeeded", "failed"):
            raise Conflict(f"fine-tuning job {job.id} has already {job.status}",
                           param="fine_tuning_job_id", code="job_not_cancellable")
        if job.status in ("validating_files", "queued", "paused"):
            job.status = "cancelled"
            job.finished_at = now()
            add_event(session, job.id, "Job cancelled")
            budget.refresh(session, file)
        elif job.status == "running" and not job.cancel_requested:
            job.cancel_requested = True
            add_event(session, job.id, "Cancellation requested; the worker stops after the "
                      "current step")
        session.commit()
        return to_object(job, _org(caller))


def pause(store: Store, caller: Caller, job_id: str) -> Job:
    """A queued job is paused at once; a running one is asked to stop after the current step
    with a checkpoint (its worker marks it ``paused``). The reservation stays."""
    with locked_session(store.sessions) as session:
        job = get_row(session, caller, job_id)
        job = session.scalar(select(JobRow).where(JobRow.id == job.id).with_for_update())
        assert job is not None
        if job.status == "queued":
            job.status = "paused"
            add_event(session, job.id, "Job paused")
        elif job.status == "running" and not job.cancel_requested:
            job.pause_requested = True
            add_event(session, job.id, "Pause requested; the worker stops after the current "
                      "step and writes a checkpoint")
        elif job.status != "paused":
            raise Conflict(f"fine-tuning job {job.id} is {job.status} and cannot be paused",
                           param="fine_tuning_job_id", code="job_not_pausable")
        session.commit()
        return to_object(job, _org(caller))


def resume(store: Store, caller: Caller, job_id: str) -> Job:
    """A paused job goes back to the queue; its worker resumes from the last checkpoint."""
    with locked_session(store.sessions) as session:
        job = get_row(session, caller, job_id)
        job = session.scalar(select(JobRow).where(JobRow.id == job.id).with_for_update())
        assert job is not None
        if job.status != "paused":
            raise Conflict(f"fine-tuning job {job.id} is {job.status}, not paused",
                           param="fine_tuning_job_id", code="job_not_paused")
        job.status = "queued"
        job.pause_requested = False
        add_event(session, job.id, "Job resumed; queued")
        session.commit()
        return to_object(job, _org(caller))


def mark_paused(store: Store, job_id: str, owner: str) -> bool:
    """Worker-side: the run stopped at a checkpoint because a pause was requested."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
        if job is None or job.status != "running" or job.lease_owner != owner:
            return False
        job.status = "paused"
        job.pause_requested = False
        job.lease_owner = None
        job.lease_expires_at = None
        add_event(session, job.id, f"Job paused at step {job.steps_done}")
        session.commit()
        return True


def end_job(store: Store, job_id: str, status: str, *, error_code: str | None = None,
            error_message: str | None = None) -> None:
    """Worker-side end of a job: the final status and the settlement of its reservation to
    the steps that ran (``steps_done``), under the file's lock."""
    if status not in budget.TERMINAL:
        raise ValueError(f"not a terminal status: {status}")
    with store.sessions() as session:
        file_id = session.scalar(select(JobRow.training_file_id).where(JobRow.id == job_id))
    with locked_session(store.sessions) as session:
        file = session.scalar(select(File).where(File.id == file_id).with_for_update())
        job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
        assert job is not None and file is not None
        if job.status in budget.TERMINAL:
            raise ValueError(f"job {job_id} has already ended ({job.status})")
        job.status = status
        job.finished_at = now()
        job.error_code, job.error_message = error_code, error_message
        job.lease_owner = None
        add_event(session, job.id, f"Job {status}", level="error" if status == "failed"
                  else "info")
        budget.refresh(session, file)
        session.commit()


def record_checkpoint(store: Store, job_id: str, step: int, epsilon_at_step: float,
                      archive: Path, metrics: dict[str, Any] | None = None) -> str:
    """Worker-side: register a checkpoint archive as a file of the job's tenant."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        assert job is not None
        if not job.privacy.get("report_train_loss", True) and metrics:
            metrics = {k: v for k, v in metrics.items() if "loss" not in k}
        row = files.store_result_file(session, store, job.tenant_id, archive,
                                      f"{job.id}-step-{step}.tar")
        ckpt = Checkpoint(id=new_id("ftckpt"), job_id=job.id, created_at=now(), step=step,
                          epsilon=epsilon_at_step, file_id=row.id, metrics=metrics)
        session.add(ckpt)
        job.result_files = [*list(job.result_files or []), row.id]
        add_event(session, job.id, f"Checkpoint at step {step}", type_="metrics",
                  data={"step": step, "epsilon_spent": epsilon_at_step, **(metrics or {})})
        session.commit()
        return ckpt.id


def start_job(store: Store, job_id: str, owner: str, lease_seconds: int = 60) -> bool:
    """Worker-side: take the lease on a queued job (or one whose lease expired) and mark it
    running. Returns False if another live worker holds it or the job is not runnable."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
        if job is None or job.status not in ("queued", "running") or job.cancel_requested:
            return False
        moment = datetime.now(UTC)
        expires = job.lease_expires_at
        if expires is not None and expires.tzinfo is None:  # SQLite returns naive datetimes
            expires = expires.replace(tzinfo=UTC)
        if job.status == "running" and job.lease_owner not in (None, owner) and (
            expires is not None and expires > moment
        ):
            return False
        job.status = "running"
        job.started_at = job.started_at or now()
        job.lease_owner = owner
        job.heartbeat_at = moment
        job.lease_expires_at = moment + timedelta(seconds=lease_seconds)
        job.attempts += 1
        add_event(session, job.id, f"Job started (attempt {job.attempts})")
        session.commit()
        return True


def record_progress(store: Store, job_id: str, steps_done: int, epsilon_spent: float,
                    metrics: dict[str, Any] | None = None) -> None:
    """Worker-side: steps done (counted when a step starts) and ε spent so far; a metrics
    event (training loss is dropped when the job has ``report_train_loss: false``)."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        assert job is not None
        if not 0 <= steps_done <= job.steps_total:
            raise ValueError(f"steps_done={steps_done} outside [0, {job.steps_total}]")
        job.steps_done = steps_done
        job.epsilon_spent = epsilon_spent
        metrics = dict(metrics or {})
        if not job.privacy.get("report_train_loss", True):
            metrics = {k: v for k, v in metrics.items() if "loss" not in k}
        add_event(session, job.id, f"Step {steps_done}/{job.steps_total}", type_="metrics",
                  data={"step": steps_done, "epsilon_spent": epsilon_spent, **metrics})
        session.commit()
