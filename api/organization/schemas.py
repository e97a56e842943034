"""Schemas of the organization domain: API keys (OpenAI's ``organization.*`` naming), the
audit log's entries and the acknowledgement of a frozen budget group."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class ApiKeyCreate(BaseModel):
    """``POST /v1/organization/api_keys``: an unknown field is a 400 naming it (checked by the
    router: ``extra`` is allowed here only to be reported)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    role: str | None = Field(
        default=None, description="admin | data_owner | trainer | viewer (default: trainer)"
    )
    name: str | None = Field(default=None, description="a label, 1 to 128 characters")


class ApiKeyObject(BaseModel):
    object: Literal["organization.api_key"] = "organization.api_key"
    id: str
    name: str | None
    role: str
    prefix: str = Field(description="the secret's first characters, to recognise it")
    created_at: int
    created_by: str | None = Field(description="the key that created it; null: the shell")
    revoked_at: int | None
    revoked_by: str | None = Field(description="the key that revoked it")


class ApiKeyCreated(ApiKeyObject):
    key: str = Field(description="the secret: shown in this response only")


class ApiKeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ApiKeyObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class ApiKeyDeleted(BaseModel):
    object: Literal["organization.api_key.deleted"] = "organization.api_key.deleted"
    id: str
    deleted: bool


class AuditLogObject(BaseModel):
    """One entry; ``hash`` chains it to ``prev_hash`` (docs/governance.md gives the spec)."""

    object: Literal["organization.audit_log"] = "organization.audit_log"
    id: str
    created_at: int
    key_id: str | None = Field(description="the key that acted; null: the server's shell")
    role: str | None
    action: str
    resource: str | None
    request_id: str | None
    detail: dict[str, Any]
    prev_hash: str
    hash: str


class AuditLogList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditLogObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class BudgetGroupAcknowledge(BaseModel):
    """``POST /v1/organization/budget_groups/{id}/acknowledge``: an unknown field is a 400
    naming it (checked by the router)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    reason: str | None = Field(default=None, description="why, 1 to 1000 characters (audited)")


class BudgetGroupObject(BaseModel):
    """A data set's budget group and its freeze (docs/operations.md, "Backups")."""

    object: Literal["organization.budget_group"] = "organization.budget_group"
    id: str
    epsilon_budget: float | None
    delta: float | None
    frozen: bool
    frozen_reason: str | None = Field(description="why no new job may train on it")
    frozen_at: int | None


class PolicyObject(BaseModel):
    """The tenant's policy on who budgets uploads (docs/governance.md)."""

    object: Literal["organization.policy"] = "organization.policy"
    trainers_set_budgets: bool = Field(
        description="true: a trainer's upload is budgeted at once, as a data owner's; false "
        "(the default): it waits for a data owner's approval"
    )


class PolicyChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainers_set_budgets: StrictBool
    reason: str | None = Field(default=None, max_length=1000, description="required")
