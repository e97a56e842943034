"""``/v1/organization``: a tenant's API keys (create, list, revoke), its audit log and the
acknowledgement of a frozen budget group, for its admins. The rules (who may, the last admin
key, what a freeze is) are the domain's (:mod:`service.governance.keys`,
:mod:`service.governance.audit`,
:mod:`service.budget.freezes`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request

from api.app_state import get_store
from api.keys.dependencies import CallerDep
from api.organization import views
from api.organization.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyDeleted,
    ApiKeyList,
    AuditLogList,
    BudgetGroupAcknowledge,
    BudgetGroupObject,
    PolicyChange,
    PolicyObject,
)
from service.base.errors import InvalidInput
from service.budget import freezes
from service.data import approvals
from service.governance import audit, keys

router = APIRouter(prefix="/v1/organization", tags=["organization"])

After = Annotated[str | None, Query(max_length=128, description="the last id of a page")]
Filter = Annotated[str | None, Query(max_length=128)]
Time = Annotated[int | None, Query(ge=0, le=2**53, description="unix seconds")]


@router.post("/api_keys", response_model=ApiKeyCreated)
def create_api_key(
    request: Request, caller: CallerDep, body: Annotated[ApiKeyCreate | None, Body()] = None
) -> ApiKeyCreated:
    """Create a key of the caller's tenant; its secret ``key`` is in this response only."""
    body = body or ApiKeyCreate()
    unknown = sorted(body.model_extra or {})
    if unknown:
        raise InvalidInput(
            f"unknown field {unknown[0][:64]!r} (known: role, name)",
            param=unknown[0][:64],
            code="unknown_field",
        )
    info, secret = keys.create_api_key(get_store(request), caller, body.role, body.name)
    return views.api_key_created(info, secret)


@router.get("/api_keys", response_model=ApiKeyList)
def list_api_keys(
    request: Request,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: After = None,
) -> ApiKeyList:
    """The tenant's keys, oldest first, revoked ones included (never their secrets)."""
    rows, has_more = keys.list_api_keys(get_store(request), caller, after, limit)
    data = [views.api_key(r) for r in rows]
    return ApiKeyList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.delete("/api_keys/{key_id}", response_model=ApiKeyDeleted)
def revoke_api_key(key_id: str, request: Request, caller: CallerDep) -> ApiKeyDeleted:
    """Revoke a key of the tenant (409 ``last_admin`` for its last active admin key)."""
    return ApiKeyDeleted(id=keys.revoke_api_key(get_store(request), caller, key_id), deleted=True)


@router.get("/audit_logs", response_model=AuditLogList)
def list_audit_logs(
    request: Request,
    caller: CallerDep,
    action: Filter = None,
    key_id: Filter = None,
    resource: Filter = None,
    since: Time = None,
    until: Time = None,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditLogList:
    """The tenant's audit log, oldest first; ``since`` ≤ created_at < ``until``."""
    filters = audit.AuditFilter(action, key_id, resource, since, until)
    rows, has_more = audit.list_entries(get_store(request), caller, filters, after, limit)
    data = [views.audit_log(r) for r in rows]
    return AuditLogList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.post("/budget_groups/{group_id}/acknowledge", response_model=BudgetGroupObject)
def acknowledge_budget_group(
    group_id: str,
    request: Request,
    caller: CallerDep,
    body: Annotated[BudgetGroupAcknowledge | None, Body()] = None,
) -> BudgetGroupObject:
    """Lift the freeze a restore put on a data set (admins only, with a reason; audited)."""
    body = body or BudgetGroupAcknowledge()
    unknown = sorted(body.model_extra or {})
    if unknown:
        raise InvalidInput(
            f"unknown field {unknown[0][:64]!r} (known: reason)",
            param=unknown[0][:64],
            code="unknown_field",
        )
    state = freezes.acknowledge(get_store(request), caller, group_id, body.reason)
    return views.budget_group(state)


@router.get("/policy", response_model=PolicyObject)
def get_policy(request: Request, caller: CallerDep) -> PolicyObject:
    """Whether the tenant's trainers may budget their own uploads."""
    return PolicyObject(
        trainers_set_budgets=approvals.policy(get_store(request), caller).trainers_set_budgets
    )


@router.post("/policy", response_model=PolicyObject)
def set_policy(body: PolicyChange, request: Request, caller: CallerDep) -> PolicyObject:
    """Let trainers budget their own uploads, or not (admins; audited with a reason)."""
    changed = approvals.set_policy(
        get_store(request), caller, body.trainers_set_budgets, body.reason
    )
    return PolicyObject(trainers_set_budgets=changed.trainers_set_budgets)
