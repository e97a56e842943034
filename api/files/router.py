"""``/v1/files``: upload, list, retrieve, delete, content, budget, budget history."""

from __future__ import annotations

import math
import re
import sys
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse

from api.app_state import get_store
from api.errors import StrictInputRoute
from api.files import views
from api.files.schemas import (
    ApproveRequest,
    BudgetHistory,
    BudgetRequest,
    FileDeleted,
    FileList,
    FileObject,
    RejectRequest,
)
from api.keys.dependencies import CallerDep
from service.base.errors import InvalidInput
from service.data import approvals, files
from service.data.budget_groups import BudgetWish

router = APIRouter(prefix="/v1/files", tags=["files"], route_class=StrictInputRoute)


UPLOAD_FIELDS = frozenset(
    {"file", "purpose", "epsilon_budget", "delta", "unbudgeted", "user_field"}
)
# a plain decimal number: no sign, spaces, underscores, inf or nan
NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


async def upload_form_fields(request: Request) -> frozenset[str]:
    """The names of the upload form's fields (the form is parsed once and cached)."""
    form = await request.form()
    return frozenset(form.keys())


def _form_number(value: str | None, name: str, *, upper: float, upper_open: bool) -> float | None:
    """A form field's number, strictly: ``1_0``, ``" 8 "``, ``true``, ``inf``, ``nan``,
    ``-1``, 0, subnormal values and values beyond ``upper`` are 400 naming the field."""
    if value is None:
        return None
    number = float(value) if NUMBER.fullmatch(value) else None
    if (
        number is None
        or not math.isfinite(number)
        or number < sys.float_info.min
        or number > upper
        or (upper_open and number == upper)
    ):
        bound = f"below {upper:g}" if upper_open else f"at most {upper:g}"
        raise InvalidInput(
            f"{name} must be a plain decimal number above 0 and {bound}, got {value[:40]!r}",
            param=name,
            code="invalid_value",
        )
    return number


def _form_flag(value: str | None, name: str) -> bool:
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    raise InvalidInput(
        f"{name} must be true or false, got {value[:40]!r}", param=name, code="invalid_value"
    )


@router.post("", response_model=FileObject)
def upload_file(
    request: Request,
    caller: CallerDep,
    file: Annotated[UploadFile, File(description="JSONL data set")],
    purpose: Annotated[str, Form(max_length=64)],
    fields: Annotated[frozenset[str], Depends(upload_form_fields)],
    epsilon_budget: Annotated[
        str | None,
        Form(
            max_length=64,
            description="privacy budget (ε) of this data set, in (0, 100]; default: the "
            "tenant's DPRC_DEFAULT_EPSILON_BUDGET, or 400 when it has none and "
            "DPRC_REQUIRE_BUDGET is on. An upload sharing an example with an existing data "
            "set joins its budget instead",
        ),
    ] = None,
    delta: Annotated[
        str | None,
        Form(max_length=64, description="δ of the budget (default 1/N^1.1 rounded down)"),
    ] = None,
    unbudgeted: Annotated[
        str | None,
        Form(
            max_length=8,
            description="true: validation-only data with no budget; no job may train on it",
        ),
    ] = None,
    user_field: Annotated[
        str | None,
        Form(
            max_length=64,
            description="user-level DP: the field naming each line's user (every line must "
            "have it). Without it a line may name its user in 'user_id', and then every line "
            "must. A data set whose lines name their users has a per-user budget "
            "(docs/privacy_unit.md)",
        ),
    ] = None,
) -> FileObject:
    unknown = sorted(fields - UPLOAD_FIELDS)
    if unknown:
        raise InvalidInput(
            f"unknown upload field {unknown[0][:40]!r}; the fields are "
            f"{', '.join(sorted(UPLOAD_FIELDS))}",
            param=unknown[0][:40],
            code="unknown_field",
        )
    given = {"epsilon_budget": epsilon_budget, "delta": delta, "unbudgeted": unbudgeted}
    for name, value in given.items():
        if name in fields and value is None:  # sent empty: FastAPI reads it as absent
            raise InvalidInput(f"{name} is empty", param=name, code="invalid_value")
    wish = BudgetWish(
        epsilon_budget=_form_number(epsilon_budget, "epsilon_budget", upper=100, upper_open=False),
        delta=_form_number(delta, "delta", upper=1, upper_open=True),
        unbudgeted=_form_flag(unbudgeted, "unbudgeted"),
    )
    store = get_store(request)
    data = files.read_capped(file.file, store.settings.max_upload_bytes)
    created = files.create_file(
        store, caller, data, file.filename, purpose, wish, user_field=user_field
    )
    return views.file_object(created, may_decide=views.decides(caller))


@router.get("", response_model=FileList)
def list_files(
    request: Request,
    caller: CallerDep,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: Annotated[str | None, Query(max_length=128)] = None,
    order: Literal["asc", "desc"] = "desc",
    include_deleted: bool = False,
    approval: Literal["approved", "pending", "rejected"] | None = None,
) -> FileList:
    rows, has_more = files.list_files(
        get_store(request), caller, purpose, limit, after, order, include_deleted, approval
    )
    data = [views.file_object(r, may_decide=views.decides(caller)) for r in rows]
    return FileList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(file_id: str, request: Request, caller: CallerDep) -> FileObject:
    return views.file_object(
        files.retrieve(get_store(request), caller, file_id), may_decide=views.decides(caller)
    )


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
    return FileResponse(path, media_type="application/octet-stream", filename=filename)


@router.post("/{file_id}/budget", response_model=FileObject)
def set_budget(
    file_id: str, body: BudgetRequest, request: Request, caller: CallerDep
) -> FileObject:
    """Change the budget of the file's data set (admins only, with a reason; audited)."""
    changed = files.set_budget(
        get_store(request), caller, file_id, body.epsilon_budget, body.delta, body.reason
    )
    return views.file_object(changed, may_decide=views.decides(caller))


@router.post("/{file_id}/approve", response_model=FileObject)
def approve_file(
    file_id: str, body: ApproveRequest, request: Request, caller: CallerDep
) -> FileObject:
    """A data owner approves a pending upload: a new budget, or joined to a budget group."""
    decided = approvals.approve(
        get_store(request),
        caller,
        file_id,
        approvals.Decision(
            reason=body.reason or "",
            epsilon_budget=body.epsilon_budget,
            delta=body.delta,
            budget_group=body.budget_group,
            unit=body.unit,
        ),
    )
    return views.file_object(decided, may_decide=views.decides(caller))


@router.post("/{file_id}/reject", response_model=FileObject)
def reject_file(
    file_id: str, body: RejectRequest, request: Request, caller: CallerDep
) -> FileObject:
    """A data owner rejects a pending upload: its content is deleted, its record kept."""
    rejected = approvals.reject(get_store(request), caller, file_id, body.reason)
    return views.file_object(rejected, may_decide=views.decides(caller))


@router.get("/{file_id}/budget/history", response_model=BudgetHistory)
def budget_history(file_id: str, request: Request, caller: CallerDep) -> BudgetHistory:
    """The file's composed ε after each of its jobs, in creation order."""
    return views.budget_history(file_id, files.budget_history(get_store(request), caller, file_id))
