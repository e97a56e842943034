"""Worker-side job operations: what a worker reads to run a job, and what it writes while and
after running it (progress, checkpoints, the end). Status changes go through
:mod:`service.jobs.lifecycle`; the job's row is the truth, the queue only carries ids."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import select

from dprc_core.accounting import SHARED_SKETCH, epsilon_for_events
from dprc_core.accounting.describe import sketch_words
from dprc_core.training.results import results_csv
from service.base.clock import now
from service.base.ids import new_id
from service.budget import budget
from service.data.file_storage import storage_dir, store_result_file
from service.jobs import lifecycle
from service.jobs.job_events import add_event
from service.jobs.ledger_files import write_job_ledger
from service.jobs.lifecycle import Actor, JobStatus
from service.models.fine_tuned_models import fine_tuned_name, root_base_name
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import (
    VALIDATION_FILE_KEY,
    Checkpoint,
    File,
    JobEvent,
    Tenant,
    validation_file_id,
)
from service.store.tables import Job as JobRow

# Metrics computed on the private training data (not covered by DP): dropped when the job
# says ``report_train_loss: false``. ``valid_loss`` is not among them: it is a function of the
# released model and the validation file only.
# computed on the private training data and not covered by DP: the realised Poisson batch size
# and the dropped count reveal (±1) whether an example was in the batch, like the loss
TRAINING_DATA_METRICS = ("train_loss", "clipped_fraction", "batch_size", "dropped")

PROGRESS_MESSAGE = "Step {step}/{steps}"  # the message of a step's metrics event


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
    devices: int = 1  # a node
    nodes: int = 1  # > 1: nodes × devices ranks through Ray (worker.ranks)
    sharding: str = "none"  # "fsdp": the model sharded over the devices' ranks (FSDP2)
    attempts: int = 0
    validation_file: str | None = None  # the validation file's id, if the job has one
    validation_path: Path | None = None  # its data; None when the file was deleted


def job_request(store: Store, job_id: str) -> JobRequest:
    with store.sessions() as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        if job is None:
            raise LookupError(f"no such job {job_id}")
        file = session.scalar(select(File).where(File.id == job.training_file_id))
        assert file is not None
        validation_path = None
        valid_id = validation_file_id(job)
        if valid_id is not None:
            valid = session.scalar(
                select(File).where(
                    File.id == valid_id, File.tenant_id == job.tenant_id, File.deleted.is_(False)
                )
            )
            validation_path = Path(valid.storage_path) if valid is not None else None
        hyperparameters = dict(job.hyperparameters)
        hyperparameters.pop(VALIDATION_FILE_KEY, None)
        return JobRequest(
            id=job.id,
            tenant_id=job.tenant_id,
            model=job.model,
            file_path=Path(file.storage_path),
            n_examples=int(file.n_examples or 0),
            hyperparameters=hyperparameters,
            privacy=dict(job.privacy),
            seed=int(job.seed),
            checkpoint_every=job.checkpoint_every,
            noise_multiplier=job.noise_multiplier,
            sample_rate=job.sample_rate,
            steps_total=job.steps_total,
            devices=job.devices,
            nodes=job.nodes,
            sharding=job.sharding,
            attempts=job.attempts,
            validation_file=valid_id,
            validation_path=validation_path,
        )


def start_job(
    store: Store,
    job_id: str,
    owner: str,
    lease_seconds: int = 60,
    devices: int = 1,
    nodes: int = 1,
) -> bool:
    """Take the lease on a queued job (or one whose lease expired) and mark it running.
    Returns False if another live worker holds it, the job needs more than ``devices`` (or
    ``nodes``: the hosts this worker can launch on), or
    the job is not runnable. A started job's ledger file is written
    (:mod:`service.jobs.ledger_files`)
    before its first step."""
    claimed = lifecycle.claim(store, job_id, owner, lease_seconds, devices, nodes)
    if claimed:
        write_job_ledger(store, job_id)
    return claimed


def record_event(store: Store, job_id: str, message: str) -> None:
    """An informational job event (e.g. where a resumed attempt starts)."""
    with locked_session(store.sessions) as session:
        add_event(session, job_id, message)
        session.commit()


def _without_loss(job: JobRow, metrics: dict[str, Any]) -> dict[str, Any]:
    """Training loss, clipping statistics and the realised batch sizes are not covered by DP:
    dropped when the job says
    ``report_train_loss: false`` (:data:`TRAINING_DATA_METRICS`); a non-finite value is null."""
    if not job.privacy.get("report_train_loss", True):
        metrics = {k: v for k, v in metrics.items() if k not in TRAINING_DATA_METRICS}
    return {k: _finite_or_none(v) for k, v in metrics.items()}


def _finite_or_none(value: Any) -> Any:
    """A non-finite float (the mean loss of an empty Poisson batch is NaN) as JSON null: the
    databases' JSON columns refuse NaN and infinities."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class AccountingMismatch(Exception):
    """The runner accounts a job otherwise than the service charged it, and not more cheaply
    in the one sound way (an ``auto`` job whose every layer resolved to exact norms)."""


EXACT_ENVELOPE = "exact"


def record_accounting(
    store: Store, job_id: str, envelope: str, sketch: str, scale_width: float | None = None
) -> bool:
    """The accountant's envelope and sketch the runner accounts the job with, once it has
    resolved its norm methods on the model (before its first step is recorded).

    The service plans ``auto`` as ``hutch`` (it has no model at creation). When every layer
    resolves to an exact norm, the mechanism that runs is exact clipping with the planned σ,
    q and steps: the job is then accounted, charged and reported as exact — one ε on every
    surface (the job, its events, checkpoints, results, ledgers and the data set's budget) — and
    one event says so. True when the row changed. Anything else that differs from the plan
    would charge less than what runs: :class:`AccountingMismatch` (the worker fails the job),
    a hidden-scale law (``scale_width``, per-example sketches; None: not reported) other than
    the one the job was charged on included: a job is charged and accounted on one law."""
    with locked_session(store.sessions) as session:
        file_id = session.scalar(select(JobRow.training_file_id).where(JobRow.id == job_id))
        group_id = session.scalar(select(File.group_id).where(File.id == file_id))
        group = budget.lock_group(session, group_id) if group_id is not None else None
        job = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
        assert job is not None
        if (envelope, sketch) == (job.accounting_envelope, job.accounting_sketch):
            charged_width = getattr(budget.planned_event(job), "scale_width", None)
            if scale_width is not None and scale_width != charged_width:
                raise AccountingMismatch(
                    f"the runner accounts the hidden-scale law scale_width={scale_width}, the "
                    f"job was charged on scale_width={charged_width}"
                )
            return False
        if envelope != EXACT_ENVELOPE or job.accounting_envelope == EXACT_ENVELOPE:
            raise AccountingMismatch(
                f"the runner accounts envelope={envelope} sketch={sketch}, the job was "
                f"charged envelope={job.accounting_envelope} sketch={job.accounting_sketch}"
            )
        privacy = dict(job.privacy)
        before = float(privacy["planned_epsilon"])
        job.accounting_envelope, job.accounting_k, job.accounting_sketch = (
            EXACT_ENVELOPE,
            None,
            SHARED_SKETCH,
        )
        charged = budget.planned_event(job)
        exact = dataclasses.replace(
            cast(Any, charged),
            envelope=EXACT_ENVELOPE,
            k=None,
            sketch=SHARED_SKETCH,
            scale_width=None,  # exact norms: no hidden scale, no scale law
        )
        privacy["event"] = exact.to_dict()
        job.privacy = dict(privacy)  # the planned event below is the re-accounted one
        planned = epsilon_for_events([budget.planned_event(job)], float(privacy["target_delta"]))
        accountant = dict(privacy.get("accountant") or {})
        accountant.update(
            clipping=EXACT_ENVELOPE,
            k=None,
            envelope=None,
            sketch=SHARED_SKETCH,
            sketch_model=sketch_words(EXACT_ENVELOPE, SHARED_SKETCH),
        )
        accountant.pop("scale_width", None)  # no hidden scale any more
        privacy.update(planned_epsilon=planned, accountant=accountant)
        job.privacy = privacy
        if group is not None:
            budget.settle(session, group)
        add_event(
            session,
            job.id,
            f"Every layer resolved to exact norms (norm method auto at max_seq_len): the job "
            f"is accounted as exact clipping, planned epsilon {planned:.4g} instead of the "
            f"{before:.4g} charged for hutch at creation; the data set's budget is charged "
            "accordingly",
            data={
                "accounting_envelope": EXACT_ENVELOPE,
                "accounting_sketch": SHARED_SKETCH,
                "planned_epsilon": planned,
                "charged_before": before,
            },
        )
        session.commit()
    write_job_ledger(store, job_id)
    return True


def record_progress(
    store: Store,
    job_id: str,
    steps_done: int,
    epsilon_spent: float,
    metrics: dict[str, Any] | None = None,
) -> None:
    """Steps done (counted when a step starts) and ε spent so far; a metrics event."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        assert job is not None
        if not 0 <= steps_done <= job.steps_total:
            raise ValueError(f"steps_done={steps_done} outside [0, {job.steps_total}]")
        job.steps_done = steps_done
        job.epsilon_spent = epsilon_spent
        metrics = _without_loss(job, dict(metrics or {}))
        add_event(
            session,
            job.id,
            PROGRESS_MESSAGE.format(step=steps_done, steps=job.steps_total),
            type_="metrics",
            data={"step": steps_done, "epsilon_spent": epsilon_spent, **metrics},
        )
        session.commit()
    write_job_ledger(store, job_id)


def record_checkpoint(
    store: Store,
    job_id: str,
    step: int,
    epsilon_at_step: float,
    archive: Path,
    metrics: dict[str, Any] | None = None,
) -> str:
    """Register a checkpoint archive as a file of the job's tenant. Its ``metrics`` are
    OpenAI's checkpoint metrics (``step``, ``train_loss``, ``valid_loss``) plus ``epsilon``
    (spent up to ``step``) and the step's other statistics."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        assert job is not None
        metrics = {**_without_loss(job, dict(metrics or {})), "epsilon": epsilon_at_step}
        row = store_result_file(session, store, job.tenant_id, archive, f"{job.id}-step-{step}.tar")
        ckpt = Checkpoint(
            id=new_id("ftckpt"),
            job_id=job.id,
            created_at=now(),
            step=step,
            epsilon=epsilon_at_step,
            file_id=row.id,
            metrics=metrics,
        )
        session.add(ckpt)
        job.result_files = [*list(job.result_files or []), row.id]
        add_event(
            session,
            job.id,
            f"Checkpoint at step {step}",
            type_="metrics",
            data={
                "step": step,
                "epsilon_spent": epsilon_at_step,
                **{k: v for k, v in metrics.items() if k != "epsilon"},
            },
        )
        session.commit()
        return ckpt.id


def recorded_progress(store: Store, job_id: str) -> tuple[int, set[int]]:
    """(steps done, the steps of the checkpoints recorded) of a job."""
    with store.sessions() as session:
        done = session.scalar(select(JobRow.steps_done).where(JobRow.id == job_id)) or 0
        steps = set(session.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)))
        return int(done), steps


def mark_paused(store: Store, job_id: str, owner: str) -> bool:
    """The run stopped at a checkpoint because a pause was requested: the job is paused and
    its lease released. False unless it is running under ``owner``."""
    try:
        row = lifecycle.move(
            store,
            job_id,
            JobStatus.PAUSED,
            by=Actor.WORKER,
            guard=lambda job: job.lease_owner == owner,
            message="Job paused at step {job.steps_done}",
            pause_requested=False,
            lease_owner=None,
            lease_expires_at=None,
        )
    except lifecycle.TransitionRefused:
        return False
    return row is not None


def end_job(
    store: Store,
    job_id: str,
    status: str,
    *,
    error_code: str | None = None,
    error_message: str | None = None,
) -> None:
    """The final status of a running job and the settlement of its reservation to the steps
    that ran (``steps_done``), under the file's lock. Raises
    :class:`~service.jobs.lifecycle.TransitionRefused` when the job has already ended."""
    target = JobStatus(status)
    if target not in lifecycle.TERMINAL:
        raise ValueError(f"not a terminal status: {status}")
    record_results(store, job_id)
    named: dict[str, Any] = {}
    if target == JobStatus.SUCCEEDED:
        named["fine_tuned_model"] = _fine_tuned_name(store, job_id)
    lifecycle.move(
        store,
        job_id,
        target,
        by=Actor.WORKER,
        message="Job {job.status}",
        level="error" if target == JobStatus.FAILED else "info",
        finished_at=now(),
        error_code=error_code,
        error_message=error_message,
        lease_owner=None,
        **named,
    )
    write_job_ledger(store, job_id)


def _fine_tuned_name(store: Store, job_id: str) -> str:
    """The model a succeeded job names (OpenAI's ``fine_tuned_model``): its root base model,
    its tenant, its suffix and its id (service.models.fine_tuned_models)."""
    with store.sessions() as session:
        model, suffix, tenant_id, tenant = session.execute(
            select(JobRow.model, JobRow.suffix, JobRow.tenant_id, Tenant.name)
            .join(Tenant, Tenant.id == JobRow.tenant_id)
            .where(JobRow.id == job_id)
        ).one()
        base = root_base_name(session, tenant_id, model)
    return fine_tuned_name(base, tenant, suffix, job_id)


def results_rows(session: Any, job_id: str) -> list[dict[str, Any]]:
    """One row per step (:data:`dprc_core.training.results.RESULT_COLUMNS`) from the job's
    step events: the last event of a step wins (an attempt that resumed after a crash replays
    the steps after its checkpoint). ``epsilon`` is the events' ``epsilon_spent``."""
    job_events = session.scalars(
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.type == "metrics")
        .order_by(JobEvent.seq)
    )
    by_step: dict[int, dict[str, Any]] = {}
    for job_event in job_events:
        data = job_event.data or {}
        step = data.get("step")
        if not isinstance(step, int) or not job_event.message.startswith("Step "):
            continue
        by_step[step] = {
            "step": step,
            "train_loss": data.get("train_loss"),
            "valid_loss": data.get("valid_loss"),
            "epsilon": data.get("epsilon_spent"),
            "clipped_fraction": data.get("clipped_fraction"),
            "batch_size": data.get("batch_size"),
            "dropped": data.get("dropped"),
        }
    return [by_step[s] for s in sorted(by_step)]


def record_results(store: Store, job_id: str) -> str | None:
    """The results CSV of a running job that is ending, as a ``fine-tune-results`` file of
    its tenant listed in its ``result_files``; None when the job is not running or ran no
    step. What it holds is what the job's metrics events hold (``report_train_loss: false``
    leaves ``train_loss`` and ``clipped_fraction`` empty)."""
    with locked_session(store.sessions) as session:
        job = session.scalar(select(JobRow).where(JobRow.id == job_id))
        if job is None or job.status != JobStatus.RUNNING.value:
            return None
        rows = results_rows(session, job.id)
        if not rows:
            return None
        fd, name = tempfile.mkstemp(suffix=".csv", dir=storage_dir(store, job.tenant_id))
        with os.fdopen(fd, "w") as fh:
            fh.write(results_csv(rows))
        row = store_result_file(session, store, job.tenant_id, Path(name), f"{job.id}-results.csv")
        job.result_files = [*list(job.result_files or []), row.id]
        add_event(session, job.id, f"Results file {row.id}: {len(rows)} steps")
        session.commit()
        return row.id
