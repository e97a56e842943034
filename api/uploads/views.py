"""The uploads domain's objects (:mod:`service.data.uploads`) as the API's schemas."""

from __future__ import annotations

from typing import Literal, cast

from api.files.views import file_object
from api.uploads.schemas import UploadObject, UploadPartObject
from service.data.uploads import Part, UploadState

Status = Literal["pending", "completed", "cancelled", "expired"]


def upload_object(state: UploadState, *, may_decide: bool = False) -> UploadObject:
    """``may_decide``: as :func:`api.files.views.file_object`'s."""
    u = state.row
    return UploadObject(
        id=u.id,
        bytes=u.bytes,
        created_at=u.created_at,
        expires_at=u.expires_at,
        filename=u.filename,
        purpose=u.purpose,
        status=cast(Status, u.status),
        file=file_object(state.file, may_decide=may_decide) if state.file is not None else None,
        mime_type=u.mime_type,
        epsilon_budget=u.epsilon_budget,
        delta=u.delta,
        unbudgeted=u.unbudgeted,
        user_field=u.user_field,
    )


def part_object(part: Part) -> UploadPartObject:
    return UploadPartObject(
        id=part.id, created_at=part.created_at, upload_id=part.upload_id, bytes=part.bytes
    )
