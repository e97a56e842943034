"""The jobs domain (:mod:`service.jobs.jobs`) and the API's schemas: a create body as the domain's
:class:`~service.jobs.jobs.JobRequest`, and the rows the use cases return (jobs, events,
checkpoints) and ledgers as the API's objects."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Literal, cast

from api.jobs.schemas import (
    Checkpoint,
    DpoHyperparameters,
    Event,
    Job,
    JobCreate,
    JobError,
    Ledger,
    PrivacyUnit,
    ShardingName,
)
from service.budget.job_units import UnitRequest
from service.governance.keys import Caller
from service.jobs import jobs
from service.store.job_status import JobStatus


def job_request(body: JobCreate) -> jobs.JobRequest:
    hp, pr = body.training_hyperparameters(), body.privacy
    method = body.method.type if body.method is not None else "supervised"
    beta = hp.beta if isinstance(hp, DpoHyperparameters) else "auto"
    return jobs.JobRequest(
        model=body.model,
        training_file=body.training_file,
        privacy=jobs.PrivacySettings(
            target_epsilon=pr.target_epsilon,
            target_delta=pr.target_delta,
            max_grad_norm=pr.max_grad_norm,
            norm_method=pr.clipping.norm_method or pr.clipping.method,
            k=pr.clipping.k,
            sketch=pr.clipping.sketch,
            noise=pr.noise.mechanism_object(),
            report_train_loss=pr.report_train_loss,
            unit=_unit(pr.unit),
        ),
        hyperparameters=jobs.Hyperparameters(
            n_epochs=hp.n_epochs,
            batch_size=hp.batch_size,
            learning_rate_multiplier=hp.learning_rate_multiplier,
            learning_rate=hp.learning_rate,
            max_seq_len=hp.max_seq_len,
            lora=hp.lora.model_dump() if hp.lora else None,
            train_only=hp.train_only,
        ),
        checkpoint_every=body.checkpoint_every,
        seed=body.seed,
        suffix=body.suffix,
        metadata=body.metadata,
        validation_file=body.validation_file,
        devices=body.devices,
        nodes=body.nodes,
        sharding=body.sharding,
        method=method,
        beta=None if method != "dpo" or beta == "auto" else float(beta),
    )


def _unit(unit: PrivacyUnit | str) -> UnitRequest:
    if isinstance(unit, str):
        return UnitRequest(type=unit)
    return UnitRequest(unit.type, unit.field, unit.max_examples_per_user)


def request_hash(body: JobCreate) -> str:
    """The fingerprint an ``Idempotency-Key`` is stored with: the body's canonical JSON, the
    norm method under its one key ``method`` (the same fingerprint whichever name the request
    used for it); fields added since, at their defaults, are left out (a request that does not
    name them fingerprints as it did before they existed)."""
    canonical = body.model_dump(mode="json")
    canonical["privacy"]["clipping"].pop("norm_method", None)
    # the unit in one form, and left out at its default (the fingerprint of a request sent
    # before units were offered stays the same)
    unit = _unit(body.privacy.unit)
    canonical["privacy"].pop("unit", None)
    if unit != UnitRequest():
        canonical["privacy"]["unit"] = asdict(unit)
    if canonical.get("method") is None:  # left out unless given (fingerprints as before)
        canonical.pop("method", None)
    # sharding left out at its default too (a request sent before sharding keeps its fingerprint)
    if canonical.get("sharding") == "none":
        del canonical["sharding"]
    if canonical.get("nodes") == 1:  # and nodes (a request sent before nodes existed)
        del canonical["nodes"]
    dump = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(dump.encode()).hexdigest()


def organization(caller: Caller) -> str:
    return f"org-{caller.tenant_id}"


def job_object(row: jobs.JobRow, caller_org: str) -> Job:
    error = None
    if row.error_code or row.error_message:
        error = JobError(code=row.error_code or "error", message=row.error_message or "")
    return Job(
        id=row.id,
        created_at=row.created_at,
        error=error,
        fine_tuned_model=row.fine_tuned_model,
        finished_at=row.finished_at,
        hyperparameters=jobs.public_hyperparameters(row),
        method=jobs.method_object(row),
        model=row.model,
        organization_id=caller_org,
        result_files=list(row.result_files or []),
        seed=row.seed,
        status=JobStatus(row.status),
        trained_tokens=row.trained_tokens,
        training_file=row.training_file_id,
        validation_file=jobs.validation_file(row),
        metadata=row.job_metadata,
        user_provided_suffix=row.suffix,
        privacy=jobs.privacy_of(row),
        steps_done=row.steps_done,
        steps_total=row.steps_total,
        checkpoint_every=row.checkpoint_every,
        cancel_requested=row.cancel_requested,
        pause_requested=bool(row.pause_requested),
        devices=row.devices,
        nodes=row.nodes,
        sharding=cast(ShardingName, row.sharding),
        created_by=row.created_by,
    )


def event_object(r: jobs.JobEvent) -> Event:
    return Event.model_validate(  # level and type: the row's strings, checked here
        {
            "id": r.id,
            "created_at": r.created_at,
            "level": r.level,
            "message": r.message,
            "type": r.type,
            "data": r.data,
        }
    )


def checkpoint_object(job: jobs.JobRow, r: jobs.Checkpoint) -> Checkpoint:
    return Checkpoint(
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


def ledger_object(led: jobs.JobLedger) -> Ledger:
    return Ledger(
        job_id=led.job_id,
        delta=led.delta,
        epsilon_spent=led.epsilon_spent,
        ledger=led.ledger,
        planned=led.planned,
        unit=cast(Literal["example", "user"], led.unit),
    )
