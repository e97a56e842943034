"""``/v1/files``: upload, list, retrieve, delete, content, budget, budget history."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse

from api.app_state import get_store
from api.files import views
from api.files.schemas import BudgetHistory, BudgetRequest, FileDeleted, FileList, FileObject
from api.keys.dependencies import CallerDep
from service import files
from service.errors import NotFound

router = APIRouter(prefix="/v1/files", tags=["files"])


@router.post("", response_model=FileObject)
def upload_file(
    request: Request,
    caller: CallerDep,
    file: Annotated[UploadFile, File(description="JSONL data set")],
    purpose: Annotated[str, Form(max_length=64)],
    epsilon_budget: Annotated[
        float | None,
        Form(gt=0, le=100, allow_inf_nan=False, description="privacy budget of this data set"),
    ] = None,
    delta: Annotated[
        float | None,
        Form(
            gt=0,
            lt=1,
            allow_inf_nan=False,
            description="δ of the budget (default 1/N^1.1 rounded down)",
        ),
    ] = None,
) -> FileObject:
    store = get_store(request)
    data = files.read_capped(file.file, store.settings.max_upload_bytes)
    created = files.create_file(store, caller, data, file.filename, purpose, epsilon_budget, delta)
    return views.file_object(created)


@router.get("", response_model=FileList)
def list_files(
    request: Request,
    caller: CallerDep,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: Annotated[str | None, Query(max_length=128)] = None,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    rows, has_more = files.list_files(get_store(request), caller, purpose, limit, after, order)
    data = [views.file_object(r) for r in rows]
    return FileList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(file_id: str, request: Request, caller: CallerDep) -> FileObject:
    return views.file_object(files.retrieve(get_store(request), caller, file_id))


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, request: Request, caller: CallerDep) -> FileDeleted:
    return FileDeleted(id=files.delete(get_store(request), caller, file_id), deleted=True)


@router.get(
    "/{file_id}/content",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def file_content(file_id: str, request: Request, caller: CallerDep) -> FileResponse:
    path, filename = files.content_path(get_store(request), caller, file_id)
    if not path.exists():
        raise NotFound(
            f"the content of file {file_id} is gone", param="file_id", code="file_not_found"
        )
    return FileResponse(path, media_type="application/octet-stream", filename=filename)


@router.post("/{file_id}/budget", response_model=FileObject)
def set_budget(
    file_id: str, body: BudgetRequest, request: Request, caller: CallerDep
) -> FileObject:
    changed = files.set_budget(get_store(request), caller, file_id, body.epsilon_budget, body.delta)
    return views.file_object(changed)


@router.get("/{file_id}/budget/history", response_model=BudgetHistory)
def budget_history(file_id: str, request: Request, caller: CallerDep) -> BudgetHistory:
    """The file's composed ε after each of its jobs, in creation order."""
    return views.budget_history(files.budget_history(get_store(request), caller, file_id))
