"""``/v1/uploads``: a file uploaded in parts, as OpenAI's Uploads API (``client.uploads``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Path, Request, UploadFile

from api.app_state import get_store
from api.errors import StrictInputRoute
from api.files.router import upload_form_fields
from api.files.views import decides
from api.keys.dependencies import CallerDep
from api.uploads import views
from api.uploads.schemas import UploadComplete, UploadCreate, UploadObject, UploadPartObject
from service.base.errors import InvalidInput
from service.data import uploads
from service.data.budget_groups import BudgetWish

router = APIRouter(prefix="/v1/uploads", tags=["uploads"], route_class=StrictInputRoute)

PART_FIELDS = frozenset({"data"})
UploadId = Annotated[str, Path(max_length=128)]


@router.post("", response_model=UploadObject)
def create_upload(body: UploadCreate, request: Request, caller: CallerDep) -> UploadObject:
    """A pending upload of ``bytes`` bytes (reserved against the tenant's storage quota until
    it is completed, cancelled or expires)."""
    if body.expires_after is not None:
        raise InvalidInput(
            "expires_after is not supported: a file is kept until it is deleted (an upload "
            "not completed expires after DPRC_UPLOAD_EXPIRY_SECONDS)",
            param="expires_after",
            code="unsupported_parameter",
        )
    created = uploads.create(
        get_store(request),
        caller,
        size=body.bytes,
        filename=body.filename,
        purpose=body.purpose,
        mime_type=body.mime_type,
        wish=BudgetWish(
            epsilon_budget=body.epsilon_budget, delta=body.delta, unbudgeted=body.unbudgeted
        ),
        user_field=body.user_field,
    )
    return views.upload_object(created)


@router.post("/{upload_id}/parts", response_model=UploadPartObject)
def add_part(
    upload_id: UploadId,
    request: Request,
    caller: CallerDep,
    data: Annotated[UploadFile, File(description="the part's bytes")],
    fields: Annotated[frozenset[str], Depends(upload_form_fields)],
) -> UploadPartObject:
    """Add a part (multipart field ``data``, at most DPRC_MAX_UPLOAD_PART_BYTES); parts may
    come in any order, their order is given at completion."""
    unknown = sorted(fields - PART_FIELDS)
    if unknown:
        raise InvalidInput(
            f"unknown part field {unknown[0][:40]!r}; the one field is data",
            param=unknown[0][:40],
            code="unknown_field",
        )
    part = uploads.add_part(get_store(request), caller, upload_id, data.file)
    return views.part_object(part)


@router.post("/{upload_id}/complete", response_model=UploadObject)
def complete_upload(
    upload_id: UploadId, body: UploadComplete, request: Request, caller: CallerDep
) -> UploadObject:
    """The parts, in the order of ``part_ids``, become a file (validated as a file upload;
    ``md5`` checked when given); the answer's ``file`` is that file."""
    done = uploads.complete(get_store(request), caller, upload_id, body.part_ids, body.md5)
    return views.upload_object(done, may_decide=decides(caller))


@router.post("/{upload_id}/cancel", response_model=UploadObject)
def cancel_upload(upload_id: UploadId, request: Request, caller: CallerDep) -> UploadObject:
    """Cancel a pending upload: its parts are deleted, its bytes no longer reserved."""
    return views.upload_object(uploads.cancel(get_store(request), caller, upload_id))
