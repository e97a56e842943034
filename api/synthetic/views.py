"""Schemas ↔ the domain's synthetic-data jobs."""

from __future__ import annotations

from api.jobs.schemas import JobCreate
from api.jobs.views import job_request
from api.synthetic.schemas import (
    SyntheticCreate,
    SyntheticError,
    SyntheticEvent,
    SyntheticEventList,
    SyntheticJob,
    SyntheticPrivacy,
)
from dprc_core.generation import SamplingSettings
from service.synthetic.synthetic_jobs import SyntheticRequest, SyntheticView


def synthetic_request(body: SyntheticCreate) -> SyntheticRequest:
    fine_tuning = None
    if body.fine_tuning is not None:
        settings = body.fine_tuning.model_dump(exclude_unset=True)
        fine_tuning = job_request(
            JobCreate.model_validate(
                {**settings, "training_file": body.training_file or "-"}, strict=False
            )
        )
    return SyntheticRequest(
        n=body.n,
        model=body.model,
        training_file=body.training_file,
        fine_tuning=fine_tuning,
        labels=body.labels,
        label_epsilon=body.label_epsilon,
        prompts=[[m.model_dump() for m in p] for p in body.prompts],
        sampling=SamplingSettings(
            body.sampling.temperature, body.sampling.top_p, body.sampling.max_tokens
        ),
        seed=body.seed,
        holdout_file=body.holdout_file,
    )


def synthetic_object(v: SyntheticView) -> SyntheticJob:
    row = v.row
    sampling = dict(row.spec.get("sampling") or {})
    sampling["max_tokens"] = sampling.pop("max_new_tokens", None)
    return SyntheticJob(
        id=row.id,
        created_at=row.created_at,
        finished_at=row.finished_at,
        status=row.status,
        n=row.n,
        records_done=row.records_done,
        format=str(row.spec.get("format")),
        model=v.model,
        fine_tuning_job=row.source_job_id,
        fine_tuning_status=v.source_status,
        training_file=row.training_file_id,
        holdout_file=row.holdout_file_id,
        result_file=row.result_file_id,
        labels=dict(row.spec.get("labels") or {}),
        download_roles=list(row.spec.get("download_roles") or []),
        sampling=sampling,
        seed=row.seed,
        privacy=SyntheticPrivacy(
            epsilon=v.epsilon,
            delta=v.delta,
            privacy_unit=v.unit,
            budget_group=row.group_id,
            events=v.events,
            label_histogram=(row.privacy or {}).get("released"),
        ),
        error=SyntheticError(code=row.error_code, message=row.error_message)
        if row.error_code
        else None,
    )


def event_list(v: SyntheticView) -> SyntheticEventList:
    return SyntheticEventList(
        data=[SyntheticEvent(**e) for e in reversed(list(v.row.events or []))], has_more=False
    )
