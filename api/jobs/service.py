"""The HTTP side of jobs: creation (plan, budget reservation, idempotency, limits), reads,
and the client's moves (cancel, pause, resume) through :mod:`service.lifecycle`. The
worker side is :mod:`service.job_runs`."""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.jobs.schemas import Checkpoint as CheckpointObject
from api.jobs.schemas import Event, Job, JobCreate, JobError, Ledger
from service.keys import Caller
from dprc_core.accounting import PrivacyEvent, PrivacyLedger
from dprc_core.training.models import (
    LoraSpec,
    ModelSettingError,
    check_max_seq_len,
    check_trainable,
)
from service import budget, job_runs, lifecycle, planning
from service import model_registry as models
from service.clock import now
from service.db import locked_session
from service.errors import Conflict, InvalidInput, LimitReached, NotFound
from service.ids import new_id
from service.job_events import add_event
from service.lifecycle import Actor, JobStatus
from service.pagination import cursor_page
from service.settings import Settings
from service.store import Store
from service.tables import Checkpoint, File, IdempotencyKey, JobEvent, Tenant
from service.tables import Job as JobRow

FORMATS_FOR_TASK = {"causal_lm": ("text", "chat"), "classification": ("classification",)}


# -- objects ----------------------------------------------------------------------------------


def to_object(row: JobRow, caller_org: str) -> Job:
    privacy = dict(row.privacy)
    privacy["epsilon_spent"] = row.epsilon_spent
    # a job stored before sketches were offered had shared ones (migration 0004)
    clipping = privacy["clipping"] = dict(privacy.get("clipping") or {})
    clipping.setdefault("sketch", "shared")
    accountant = privacy["accountant"] = dict(privacy.get("accountant") or {})
    accountant.setdefault("sketch", row.accounting_sketch)
    error = None
    if row.error_code or row.error_message:
        error = JobError(code=row.error_code or "error", message=row.error_message or "")
    return Job(
        id=row.id,
        created_at=row.created_at,
        error=error,
        fine_tuned_model=row.fine_tuned_model,
        finished_at=row.finished_at,
        hyperparameters={
            k: v for k, v in row.hyperparameters.items() if k != job_runs.VALIDATION_FILE_KEY
        },
        model=row.model,
        organization_id=caller_org,
        result_files=list(row.result_files or []),
        seed=row.seed,
        status=JobStatus(row.status),
        trained_tokens=row.trained_tokens,
        training_file=row.training_file_id,
        validation_file=job_runs.validation_file_id(row),
        metadata=row.job_metadata,
        user_provided_suffix=row.suffix,
        privacy=privacy,
        steps_done=row.steps_done,
        steps_total=row.steps_total,
        checkpoint_every=row.checkpoint_every,
        cancel_requested=row.cancel_requested,
        pause_requested=bool(row.pause_requested),
        devices=row.devices,
    )


def _org(caller: Caller) -> str:
    return f"org-{caller.tenant_id}"


def _request_hash(req: JobCreate) -> str:
    body = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _idempotent(session: Session, caller: Caller, key: str, digest: str) -> JobRow | None:
    row = session.scalar(
        select(IdempotencyKey).where(
            IdempotencyKey.tenant_id == caller.tenant_id, IdempotencyKey.key == key
        )
    )
    if row is None:
        return None
    if row.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was already used with a different request",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    job = session.scalar(select(JobRow).where(JobRow.id == row.job_id))
    assert job is not None
    return job


# -- create -----------------------------------------------------------------------------------


def create_job(store: Store, caller: Caller, req: JobCreate, idempotency_key: str | None) -> Job:
    """Validate, plan, then — under the tenant's and the file's locks — check the active-job
    limit and the file's budget (the composed ε with this job's planned event) and insert."""
    digest = _request_hash(req)
    if idempotency_key is not None:
        with store.sessions() as session:
            existing = _idempotent(session, caller, idempotency_key, digest)
            if existing is not None:
                return to_object(existing, _org(caller))

    model = models.get_model(store.settings, req.model)
    _check_devices(store.settings, req.devices)
    with store.sessions() as session:
        file = _training_file(session, caller, req.training_file, locked=False)
        if file.purpose != "fine-tune" or file.n_examples is None:
            raise InvalidInput(
                f"file {file.id} is not a fine-tune data set",
                param="training_file",
                code="invalid_file",
            )
        n, fmt = file.n_examples, file.data_format
    if fmt not in FORMATS_FOR_TASK[model.task]:
        raise InvalidInput(
            f"model {model.name!r} ({model.task}) needs lines of format "
            f"{' or '.join(FORMATS_FOR_TASK[model.task])}; file {req.training_file} is {fmt}",
            param="training_file",
            code="invalid_file",
        )
    if req.validation_file is not None:
        _check_validation_file(store, caller, req, FORMATS_FOR_TASK[model.task])
    plan = planning.make_plan(plan_request(req), n, store.settings.default_k)
    check_model_settings(models.ensure_local(model), model.task, req)  # built on first use
    new_event = plan.event()  # built before the locks (ν-DP-FTRL's needs its sensitivity)
    # The budget's composition (seconds of accountant work on a long history) runs outside
    # the locks on a snapshot of the file's events; under the locks the snapshot is checked
    # and, if another job changed the file meanwhile, composed again outside them (then, on
    # the last attempt, under them: always the composed ε of the file's current events).
    # Creates on one file take turns in this process (a lock per file, not the database's):
    # each composes once, on a snapshot no one here changes meanwhile; the database's write
    # lock is held only to check the snapshot and insert. Other processes (API replicas) are
    # caught by the snapshot check.
    with _file_turn(req.training_file):
        known = _budget_snapshot(store, caller, req.training_file, new_event)
        deadline = time.monotonic() + OPTIMISTIC_SECONDS
        while True:
            last = time.monotonic() > deadline  # then composed under the locks, whatever it costs
            done, stale = _create_locked(
                store, caller, req, plan, new_event, known, idempotency_key, digest, last
            )
            if done is not None:
                return done
            known = stale


def _check_devices(settings: Settings, devices: int) -> None:
    """A job no worker can ever fit is refused now, not left queued for ever."""
    largest = settings.max_job_devices or settings.worker_devices
    if devices > largest:
        raise InvalidInput(
            f"devices={devices}: the largest worker of this service has {largest} device(s) "
            "(DPRC_MAX_JOB_DEVICES / DPRC_WORKER_DEVICES)",
            param="devices",
            code="devices_unavailable",
        )


# -- the job's settings against its model --------------------------------------------------


_SETTING_PARAMS = {
    "max_seq_len": "hyperparameters.max_seq_len",
    "lora": "hyperparameters.lora.target_modules",
    "train_only": "hyperparameters.train_only",
}


def check_model_settings(path: Path, task: str, req: JobCreate) -> None:
    """400 if the model cannot take the job's ``max_seq_len`` (beyond its positions), LoRA
    target modules (matching no module) or ``train_only`` (leaving nothing to train): checked
    with the library's validators (``dprc_core.training.models``) on the model's config and
    architecture on the meta device, never its weights; cached per model and settings."""
    hp = req.hyperparameters
    lora = None
    if hp.lora is not None:  # what the worker gets (hyperparameters["lora"]), hashable
        lora = tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in hp.lora.model_dump().items()
        )
    train_only = tuple(hp.train_only) if hp.train_only is not None else None
    stamp = (path / "config.json").stat().st_mtime_ns
    try:
        check_max_seq_len(path, hp.max_seq_len)
    except ModelSettingError as exc:
        refused: tuple[str, str] | None = (exc.field, str(exc))
    else:
        refused = _check_trainable_cached(str(path), stamp, task, lora, train_only)
    if refused is not None:
        field, message = refused
        raise InvalidInput(message, param=_SETTING_PARAMS[field], code="invalid_hyperparameters")


@functools.lru_cache(maxsize=256)
def _check_trainable_cached(
    path: str,
    _config_stamp: int,
    task: str,
    lora: tuple[tuple[str, Any], ...] | None,
    train_only: tuple[str, ...] | None,
) -> tuple[str, str] | None:
    """(field, reason) of a refusal, or None; refusals are cached too (a meta-device build
    costs a fraction of a second of CPU)."""
    spec = None
    if lora is not None:  # as worker.execution.build_spec builds it
        kwargs: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in lora}
        spec = LoraSpec(**kwargs)
    try:
        check_trainable(path, task, spec, list(train_only) if train_only is not None else None)
    except ModelSettingError as exc:
        return exc.field, str(exc)
    return None


_TURNS: dict[str, threading.Lock] = {}
_TURNS_GUARD = threading.Lock()


@contextmanager
def _file_turn(file_id: str) -> Iterator[None]:
    with _TURNS_GUARD:
        turn = _TURNS.setdefault(file_id, threading.Lock())
    with turn:
        yield


# How long a create keeps composing outside the locks while other creates change its file
# (each retry means another job was committed: progress); after that it composes under them.
OPTIMISTIC_SECONDS = 120.0

Snapshot = tuple[lifecycle.FileEvents, tuple[float, float]] | None


def _budget_snapshot(
    store: Store, caller: Caller, file_id: str, new_event: PrivacyEvent
) -> Snapshot:
    """The file's events and their totals with ``new_event``, composed under no lock."""
    with store.sessions() as session:
        file = _training_file(session, caller, file_id, locked=False)
        if file.epsilon_budget is None or file.delta is None:
            return None
        events, delta = lifecycle.file_events(session, file), file.delta
    lifecycle.totals(events, delta)  # warms the cache for a refusal's message
    return events, lifecycle.totals(events, delta, new_event)


def _create_locked(
    store: Store,
    caller: Caller,
    req: JobCreate,
    plan: planning.Plan,
    new_event: PrivacyEvent,
    known: Snapshot,
    idempotency_key: str | None,
    digest: str,
    last: bool,
) -> tuple[Job | None, Snapshot]:
    """One locked attempt: (the job, None), or (None, a fresh snapshot) when the file's
    events changed since ``known`` and this is not the ``last`` attempt."""
    with locked_session(store.sessions) as session:
        # lock order: tenant row, then file row (FOR UPDATE on PostgreSQL; BEGIN IMMEDIATE on
        # SQLite holds the write lock for the whole transaction)
        session.get(Tenant, caller.tenant_id, with_for_update=True)
        if idempotency_key is not None:
            existing = _idempotent(session, caller, idempotency_key, digest)
            if existing is not None:
                return to_object(existing, _org(caller)), None
        file = _training_file(session, caller, req.training_file, locked=True)
        _check_active_jobs(session, caller, store.settings.max_active_jobs_per_tenant)
        stale: tuple[lifecycle.FileEvents, float] | None = None
        if file.epsilon_budget is not None and file.delta is not None and not last:
            events = lifecycle.file_events(session, file)
            if known is None or known[0] != events:
                stale = (events, file.delta)
                session.rollback()  # leave the locks; compose again outside them
        if stale is None:
            job = _reserve_and_insert(
                session, caller, file, req, plan, new_event, known, idempotency_key, digest
            )
            return job, None
    events, delta = stale
    lifecycle.totals(events, delta)  # under no lock, as the snapshot
    return None, (events, lifecycle.totals(events, delta, new_event))


def _reserve_and_insert(
    session: Session,
    caller: Caller,
    file: File,
    req: JobCreate,
    plan: planning.Plan,
    new_event: PrivacyEvent,
    known: Snapshot,
    idempotency_key: str | None,
    digest: str,
) -> Job:
    """Under the locks: reserve the job's planned event on the file (or refuse it) and insert
    it with its Idempotency-Key, in one commit."""
    _reserve(session, file, plan, new_event, known)
    row = _insert_job(session, caller, req, plan)
    if idempotency_key is not None:
        session.add(
            IdempotencyKey(
                tenant_id=caller.tenant_id,
                key=idempotency_key,
                request_hash=digest,
                job_id=row.id,
                created_at=now(),
            )
        )
    session.commit()
    return to_object(row, _org(caller))


def _training_file(session: Session, caller: Caller, file_id: str, *, locked: bool) -> File:
    """The caller's (not deleted) file, its row locked when ``locked``; else 404."""
    if locked:
        file = budget.lock_file(session, file_id, caller.tenant_id)
    else:
        file = session.scalar(
            select(File).where(
                File.id == file_id, File.tenant_id == caller.tenant_id, File.deleted.is_(False)
            )
        )
    if file is None:
        raise NotFound(
            f"no such file: {file_id[:64]!r}", param="training_file", code="file_not_found"
        )
    return file


def _check_validation_file(
    store: Store, caller: Caller, req: JobCreate, formats: tuple[str, ...]
) -> None:
    """The validation file: the caller's fine-tune data set (else 404), of a format the model's
    task reads, not the training file (its loss would be a non-private statistic of the training
    data) and without a privacy budget (valid_loss is not a DP release of it)."""
    assert req.validation_file is not None
    param = "validation_file"
    with store.sessions() as session:
        file = session.scalar(
            select(File).where(
                File.id == req.validation_file,
                File.tenant_id == caller.tenant_id,
                File.deleted.is_(False),
            )
        )
        if file is None:
            raise NotFound(
                f"no such file: {req.validation_file[:64]!r}", param=param, code="file_not_found"
            )
        if file.purpose != "fine-tune" or file.n_examples is None:
            raise InvalidInput(
                f"file {file.id} is not a fine-tune data set", param=param, code="invalid_file"
            )
        if file.id == req.training_file:
            raise InvalidInput(
                "the validation file is the training file: its valid_loss would be a "
                "statistic of the training data that differential privacy does not cover",
                param=param,
                code="invalid_file",
            )
        if file.data_format not in formats:
            raise InvalidInput(
                f"file {file.id} is {file.data_format}; the model needs {' or '.join(formats)}",
                param=param,
                code="invalid_file",
            )
        if file.epsilon_budget is not None:
            raise InvalidInput(
                f"file {file.id} has a privacy budget: valid_loss on it is not a "
                "differentially private release, so it cannot be a validation file",
                param=param,
                code="invalid_file",
            )


def _check_active_jobs(session: Session, caller: Caller, limit: int) -> None:
    active = (
        session.scalar(
            select(func.count())
            .select_from(JobRow)
            .where(JobRow.tenant_id == caller.tenant_id, JobRow.status.in_(lifecycle.ACTIVE))
        )
        or 0
    )
    if active >= limit:
        raise LimitReached(
            f"too many active fine-tuning jobs ({active}, limit {limit}); "
            "wait for one to end or cancel one",
            code="too_many_active_jobs",
        )


def _reserve(
    session: Session, file: File, plan: planning.Plan, new_event: PrivacyEvent, known: Snapshot
) -> None:
    """Refuse the job if the composed ε of the file's events with its planned event exceeds
    the file's budget (never a sum of ε's); call under the file's lock."""
    if file.epsilon_budget is None or file.delta is None:
        return
    spent, committed = lifecycle.settle(session, file, extra=new_event, known=known)
    if committed <= file.epsilon_budget:
        return
    _before, current = lifecycle.totals(lifecycle.file_events(session, file), file.delta)
    session.rollback()
    remaining = max(0.0, file.epsilon_budget - current)
    raise Conflict(
        f"privacy budget of file {file.id} exceeded: budget epsilon="
        f"{file.epsilon_budget:g} at delta={file.delta:g}; already committed "
        f"epsilon={current:.4g} (spent {spent:.4g}); remaining epsilon="
        f"{remaining:.4g}; this job (planned epsilon={plan.planned_epsilon:.4g} at "
        f"its delta={plan.target_delta:g}) would bring the composed epsilon to "
        f"{committed:.4g}",
        param="training_file",
        code="budget_exceeded",
    )


def plan_request(req: JobCreate) -> planning.PlanRequest:
    hp, pr = req.hyperparameters, req.privacy
    return planning.PlanRequest(
        target_epsilon=pr.target_epsilon,
        target_delta=pr.target_delta,
        n_epochs=hp.n_epochs,
        batch_size=hp.batch_size,
        method=pr.clipping.method,
        k=pr.clipping.k,
        mechanism=pr.noise.mechanism,
        nu=pr.noise.nu,
        bands=pr.noise.bands,
        sketch=planning.job_sketch(pr.clipping.method, pr.noise.mechanism, pr.clipping.sketch),
    )


def _insert_job(session: Session, caller: Caller, req: JobCreate, plan: planning.Plan) -> JobRow:
    hp = req.hyperparameters
    lrm = hp.learning_rate_multiplier
    hyper: dict[str, Any] = {
        "n_epochs": plan.n_epochs,
        "batch_size": plan.batch_size,
        "learning_rate_multiplier": None
        if hp.learning_rate is not None
        else (1.0 if lrm in (None, "auto") else lrm),
        "learning_rate": hp.learning_rate,
        "max_seq_len": hp.max_seq_len,
        "lora": hp.lora.model_dump() if hp.lora else None,
        "train_only": hp.train_only,
    }
    if req.validation_file is not None:
        hyper[job_runs.VALIDATION_FILE_KEY] = req.validation_file
    pr = req.privacy
    privacy = {
        "target_epsilon": pr.target_epsilon,
        "target_delta": plan.target_delta,
        "max_grad_norm": pr.max_grad_norm,
        "clipping": {
            "method": plan.method,
            "k": plan.k,
            "sketch": planning.job_sketch(
                pr.clipping.method, pr.noise.mechanism, pr.clipping.sketch
            ),
        },
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
        id=new_id("ftjob"),
        tenant_id=caller.tenant_id,
        model=req.model,
        training_file_id=req.training_file,
        status=lifecycle.INITIAL.value,
        created_at=now(),
        hyperparameters=hyper,
        privacy=privacy,
        seed=req.seed if req.seed is not None else secrets.randbits(63),  # secret: 63 bits
        suffix=req.suffix,
        job_metadata=req.metadata,
        checkpoint_every=req.checkpoint_every,
        noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate,
        steps_total=plan.steps,
        accounting_clipping=plan.accounting_clipping,
        accounting_k=plan.accounting_k,
        accounting_sketch=plan.sketch,
        steps_done=0,
        epsilon_spent=0.0,
        result_files=[],
        cancel_requested=False,
        attempts=0,
        devices=req.devices,
    )
    session.add(row)
    session.flush()
    add_event(session, row.id, f"Created fine-tuning job: {row.id}")
    add_event(
        session,
        row.id,
        f"Privacy plan: noise multiplier {plan.noise_multiplier:.4g}, sample rate "
        f"{plan.sample_rate:.4g}, {plan.steps} steps, planned epsilon "
        f"{plan.planned_epsilon:.4g} at delta {plan.target_delta:g}"
        + (", per-example sketches" if plan.sketch != "shared" else ""),
        data={
            "noise_multiplier": plan.noise_multiplier,
            "sample_rate": plan.sample_rate,
            "steps": plan.steps,
            "planned_epsilon": plan.planned_epsilon,
            "target_delta": plan.target_delta,
            "sketch": plan.sketch,
        },
    )
    add_event(session, row.id, "Job queued")
    return row


# -- reads ------------------------------------------------------------------------------------


def get_row(session: Session, caller: Caller, job_id: str) -> JobRow:
    row = session.scalar(
        select(JobRow).where(JobRow.id == job_id, JobRow.tenant_id == caller.tenant_id)
    )
    if row is None:
        raise NotFound(
            f"no such fine-tuning job: {job_id[:64]!r}",
            param="fine_tuning_job_id",
            code="job_not_found",
        )
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


def list_events(
    store: Store, caller: Caller, job_id: str, after: str | None, limit: int
) -> tuple[list[Event], bool]:
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        q = select(JobEvent).where(JobEvent.job_id == job.id)
        rows, more = cursor_page(session, q, JobEvent, after, limit, "event")
        data = [
            Event(
                id=r.id,
                created_at=r.created_at,
                level=r.level,
                message=r.message,
                type=r.type,
                data=r.data,
            )
            for r in rows
        ]
        return data, more


def list_checkpoints(
    store: Store, caller: Caller, job_id: str, after: str | None, limit: int
) -> tuple[list[CheckpointObject], bool]:
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        q = select(Checkpoint).where(Checkpoint.job_id == job.id)
        rows, more = cursor_page(session, q, Checkpoint, after, limit, "checkpoint")
        data = [
            CheckpointObject(
                id=r.id,
                created_at=r.created_at,
                fine_tuned_model_checkpoint=f"ft:{job.model}:{job.suffix or ''}:{job.id}:"
                f"ckpt-step-{r.step}",
                fine_tuning_job_id=job.id,
                metrics={"step": r.step, **(r.metrics or {})},
                step_number=r.step,
                epsilon=r.epsilon,
                file_id=r.file_id,
            )
            for r in rows
        ]
        return data, more


def ledger(store: Store, caller: Caller, job_id: str) -> Ledger:
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        spent = budget.spent_event(job)
        led = PrivacyLedger([spent] if spent is not None else [])
        delta = float(job.privacy["target_delta"])
        return Ledger(
            job_id=job.id,
            delta=delta,
            epsilon_spent=led.epsilon(delta),
            ledger=json.loads(led.to_json()),
            planned=budget.planned_event(job).to_dict(),
        )


# -- the client's moves -----------------------------------------------------------------------


def cancel(store: Store, caller: Caller, job_id: str) -> Job:
    """Queued and paused jobs end now (their reservation is released); a running job is asked
    to stop and its worker ends it, settling to the steps that ran."""
    row = lifecycle.move(
        store,
        job_id,
        JobStatus.CANCELLED,
        by=Actor.CLIENT,
        tenant_id=caller.tenant_id,
        message="Job cancelled",
        finished_at=now(),
    )
    assert row is not None
    return to_object(row, _org(caller))


def pause(store: Store, caller: Caller, job_id: str) -> Job:
    """A queued job is paused at once; a running one is asked to stop after the current step
    with a checkpoint (its worker marks it ``paused``). The reservation stays."""
    row = lifecycle.move(
        store,
        job_id,
        JobStatus.PAUSED,
        by=Actor.CLIENT,
        tenant_id=caller.tenant_id,
        message="Job paused",
    )
    assert row is not None
    return to_object(row, _org(caller))


def resume(store: Store, caller: Caller, job_id: str) -> Job:
    """A paused job goes back to the queue; its worker resumes from the last checkpoint."""
    row = lifecycle.move(
        store,
        job_id,
        JobStatus.QUEUED,
        by=Actor.CLIENT,
        tenant_id=caller.tenant_id,
        message="Job resumed; queued",
        pause_requested=False,
    )
    assert row is not None
    return to_object(row, _org(caller))
