"""The organization domain's objects (:mod:`service.governance.keys`,
:mod:`service.governance.audit`) as the API's
schemas."""

from __future__ import annotations

from api.organization.schemas import (
    ApiKeyCreated,
    ApiKeyObject,
    AuditLogObject,
    BudgetGroupObject,
)
from service.budget.freezes import GroupState
from service.governance.audit import Entry
from service.governance.keys import KeyInfo


def api_key(info: KeyInfo) -> ApiKeyObject:
    return ApiKeyObject(
        id=info.id,
        name=info.name,
        role=info.role,
        prefix=info.prefix,
        created_at=info.created_at,
        created_by=info.created_by,
        revoked_at=info.revoked_at,
        revoked_by=info.revoked_by,
    )


def api_key_created(info: KeyInfo, secret: str) -> ApiKeyCreated:
    return ApiKeyCreated(**api_key(info).model_dump(exclude={"object"}), key=secret)


def audit_log(entry: Entry) -> AuditLogObject:
    return AuditLogObject(
        id=entry.id,
        created_at=entry.created_at,
        key_id=entry.key_id,
        role=entry.role,
        action=entry.action,
        resource=entry.resource,
        request_id=entry.request_id,
        detail=entry.detail,
        prev_hash=entry.prev_hash,
        hash=entry.hash,
    )


def budget_group(state: GroupState) -> BudgetGroupObject:
    return BudgetGroupObject(
        id=state.id,
        epsilon_budget=state.epsilon_budget,
        delta=state.delta,
        frozen=state.frozen_reason is not None,
        frozen_reason=state.frozen_reason,
        frozen_at=state.frozen_at,
    )
