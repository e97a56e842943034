"""``/v1/fine_tuning/jobs``: create, list, retrieve, cancel, events, checkpoints, ledger."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request

from api.app_state import get_dispatcher, get_store
from api.jobs import views
from api.jobs.schemas import CheckpointList, EventList, Job, JobCreate, JobList, Ledger
from api.keys.dependencies import CallerDep
from service.jobs import jobs
from service.store.job_status import JobStatus

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["fine-tuning"])

Limit = Annotated[int, Query(ge=1, le=100)]
After = Annotated[str | None, Query(max_length=128)]


@router.post("", response_model=Job)
def create_job(
    body: JobCreate,
    request: Request,
    caller: CallerDep,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$"),
    ] = None,
) -> Job:
    idem = None
    if idempotency_key is not None:
        idem = jobs.Idempotency(idempotency_key, views.request_hash(body))
    row = jobs.create_job(get_store(request), caller, views.job_request(body), idem)
    job = views.job_object(row, views.organization(caller))
    if job.status == JobStatus.QUEUED:
        get_dispatcher(request).submit(job.id, job.devices, job.nodes)
    return job


@router.get("", response_model=JobList)
def list_jobs(
    request: Request, caller: CallerDep, after: After = None, limit: Limit = 20
) -> JobList:
    rows, has_more = jobs.list_jobs(get_store(request), caller, after, limit)
    org = views.organization(caller)
    return JobList(data=[views.job_object(r, org) for r in rows], has_more=has_more)


@router.get("/{fine_tuning_job_id}", response_model=Job)
def retrieve_job(fine_tuning_job_id: str, request: Request, caller: CallerDep) -> Job:
    row = jobs.retrieve(get_store(request), caller, fine_tuning_job_id)
    return views.job_object(row, views.organization(caller))


@router.post("/{fine_tuning_job_id}/pause", response_model=Job)
def pause_job(fine_tuning_job_id: str, request: Request, caller: CallerDep) -> Job:
    row = jobs.pause(get_store(request), caller, fine_tuning_job_id)
    return views.job_object(row, views.organization(caller))


@router.post("/{fine_tuning_job_id}/resume", response_model=Job)
def resume_job(fine_tuning_job_id: str, request: Request, caller: CallerDep) -> Job:
    row = jobs.resume(get_store(request), caller, fine_tuning_job_id)
    get_dispatcher(request).submit(row.id, row.devices, row.nodes)
    return views.job_object(row, views.organization(caller))


@router.post("/{fine_tuning_job_id}/cancel", response_model=Job)
def cancel_job(fine_tuning_job_id: str, request: Request, caller: CallerDep) -> Job:
    row = jobs.cancel(get_store(request), caller, fine_tuning_job_id)
    return views.job_object(row, views.organization(caller))


@router.get("/{fine_tuning_job_id}/events", response_model=EventList)
def list_events(
    fine_tuning_job_id: str,
    request: Request,
    caller: CallerDep,
    after: After = None,
    limit: Limit = 20,
) -> EventList:
    """Job events. Metrics in ``data`` (such as ``train_loss``) are computed on the private
    training data and are **not** covered by the differential-privacy guarantee; create the
    job with ``privacy.report_train_loss: false`` to turn them off."""
    rows, has_more = jobs.list_events(get_store(request), caller, fine_tuning_job_id, after, limit)
    return EventList(data=[views.event_object(r) for r in rows], has_more=has_more)


@router.get("/{fine_tuning_job_id}/checkpoints", response_model=CheckpointList)
def list_checkpoints(
    fine_tuning_job_id: str,
    request: Request,
    caller: CallerDep,
    after: After = None,
    limit: Limit = 10,
) -> CheckpointList:
    job, rows, has_more = jobs.list_checkpoints(
        get_store(request), caller, fine_tuning_job_id, after, limit
    )
    data = [views.checkpoint_object(job, r) for r in rows]
    return CheckpointList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/{fine_tuning_job_id}/ledger", response_model=Ledger)
def job_ledger(fine_tuning_job_id: str, request: Request, caller: CallerDep) -> Ledger:
    return views.ledger_object(jobs.ledger(get_store(request), caller, fine_tuning_job_id))
