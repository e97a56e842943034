"""OpenAI Upload and Upload Part objects (``client.uploads``), with the budget asked for as
extra fields."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from api.files.schemas import Delta, Epsilon, FileObject


class UploadCreate(BaseModel):
    """``POST /v1/uploads``: OpenAI's fields, and the data set's budget as extra fields (the
    official client's ``extra_body``), as a file upload takes them."""

    model_config = ConfigDict(extra="forbid")

    bytes: int = Field(
        strict=True, ge=1, description="the file's size; at most DPRC_MAX_UPLOAD_TOTAL_BYTES"
    )
    filename: str = Field(min_length=1, max_length=1000)
    mime_type: str = Field(max_length=255, description="e.g. text/jsonl")
    purpose: str = Field(max_length=64, description="fine-tune")
    expires_after: dict[str, Any] | None = Field(
        default=None, description="not supported: a file is kept until it is deleted"
    )
    epsilon_budget: Epsilon | None = Field(
        default=None,
        description="privacy budget (ε) of the data set, in (0, 100]; default: the tenant's "
        "DPRC_DEFAULT_EPSILON_BUDGET (applied at completion), or 400 at completion when it has "
        "none and DPRC_REQUIRE_BUDGET is on. A data set sharing an example with an existing "
        "one joins its budget instead",
    )
    delta: Delta | None = Field(default=None, description="δ of the budget (default 1/N^1.1)")
    unbudgeted: StrictBool = Field(
        default=False,
        description="true: validation-only data with no budget; no job may train on it",
    )
    user_field: str | None = Field(
        default=None,
        max_length=64,
        description="user-level DP: the field naming each line's user (every line must have "
        "it; docs/privacy_unit.md)",
    )


class UploadComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    part_ids: list[Annotated[str, Field(max_length=128)]] = Field(
        description="the upload's parts in the order they make the file"
    )
    md5: str | None = Field(
        default=None, max_length=64, description="the MD5 (hex) of the whole file, checked"
    )


class UploadObject(BaseModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None = Field(default=None, description="the file, once completed")
    mime_type: str
    epsilon_budget: float | None = Field(default=None, description="as asked at creation")
    delta: float | None = Field(default=None, description="as asked at creation")
    unbudgeted: bool = False
    user_field: str | None = Field(default=None, description="as asked at creation")


class UploadPartObject(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
    bytes: int
