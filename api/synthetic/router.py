"""``/v1/synthetic_data/jobs``: create, list, retrieve, cancel, events, the owner's report."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from api.app_state import get_dispatcher, get_store
from api.keys.dependencies import CallerDep
from api.synthetic import views
from api.synthetic.schemas import (
    Sharing,
    SyntheticCreate,
    SyntheticEventList,
    SyntheticJob,
    SyntheticJobList,
)
from service.store.job_status import JobStatus
from service.synthetic import synthetic_jobs

router = APIRouter(prefix="/v1/synthetic_data/jobs", tags=["synthetic data"])

Limit = Annotated[int, Query(ge=1, le=100)]
After = Annotated[str | None, Query(max_length=128)]


@router.post("", response_model=SyntheticJob)
def create(body: SyntheticCreate, request: Request, caller: CallerDep) -> SyntheticJob:
    store = get_store(request)
    row = synthetic_jobs.create(store, caller, views.synthetic_request(body))
    view = synthetic_jobs.retrieve(store, caller, row.id)
    dispatcher = get_dispatcher(request)
    if view.source_status == JobStatus.QUEUED:  # its fine-tuning job runs first
        dispatcher.submit(row.source_job_id)
    else:
        dispatcher.submit(row.id)
    return views.synthetic_object(view)


@router.get("", response_model=SyntheticJobList)
def list_jobs(
    request: Request, caller: CallerDep, after: After = None, limit: Limit = 20
) -> SyntheticJobList:
    rows, more = synthetic_jobs.list_jobs(get_store(request), caller, after, limit)
    return SyntheticJobList(data=[views.synthetic_object(v) for v in rows], has_more=more)


@router.get("/{job_id}", response_model=SyntheticJob)
def retrieve(job_id: str, request: Request, caller: CallerDep) -> SyntheticJob:
    return views.synthetic_object(synthetic_jobs.retrieve(get_store(request), caller, job_id))


@router.post("/{job_id}/cancel", response_model=SyntheticJob)
def cancel(job_id: str, request: Request, caller: CallerDep) -> SyntheticJob:
    return views.synthetic_object(synthetic_jobs.cancel(get_store(request), caller, job_id))


@router.get("/{job_id}/events", response_model=SyntheticEventList)
def events(job_id: str, request: Request, caller: CallerDep) -> SyntheticEventList:
    return views.event_list(synthetic_jobs.retrieve(get_store(request), caller, job_id))


@router.post("/{job_id}/sharing", response_model=SyntheticJob)
def share(job_id: str, body: Sharing, request: Request, caller: CallerDep) -> SyntheticJob:
    """Who (besides admin) may download the records: admin and data_owner keys set it."""
    view = synthetic_jobs.share(get_store(request), caller, job_id, body.download_roles)
    return views.synthetic_object(view)


@router.get("/{job_id}/report")
def report(job_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """The owner's report: not DP (it reads the private data); admin and data_owner only."""
    return synthetic_jobs.report(get_store(request), caller, job_id)
