"""Frozen data sets: a budget group that takes no new job until an admin acknowledges it.

``dprc admin restore`` (:mod:`service.admin.restore`) freezes every group on which jobs ran after
the backup it restores: the restored database does not hold what those jobs spent, so its
budget would be reopened by the restore. A frozen group refuses job creation with 409
``budget_group_frozen`` (:func:`service.budget.budget.refuse_if_frozen`, in the reservation);
uploads,
reads, downloads, budget changes and the jobs it already has are unaffected. An admin lifts
the freeze with a reason — over HTTP (``POST /v1/organization/budget_groups/{id}/acknowledge``)
or on the server's shell (``dprc admin acknowledge``) — typically after lowering the data set's
budget by what the lost jobs spent. Freezing and acknowledging are audited.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, NotFound
from service.budget.budget import lock_group
from service.governance import audit
from service.governance.audit import Act, Actor
from service.governance.caller import Caller
from service.governance.roles import Action, authorize
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import BudgetGroup, Tenant

REASON_MAX = 1000


@dataclass(frozen=True)
class GroupState:
    """A budget group's freeze as the API and the shell show it."""

    id: str
    tenant_id: int
    epsilon_budget: float | None
    delta: float | None
    frozen_reason: str | None
    frozen_at: int | None


def state(group: BudgetGroup) -> GroupState:
    return GroupState(
        id=group.id,
        tenant_id=group.tenant_id,
        epsilon_budget=group.epsilon_budget,
        delta=group.delta,
        frozen_reason=group.frozen_reason,
        frozen_at=group.frozen_at,
    )


def freeze(session: Session, group: BudgetGroup, reason: str, at: int | None = None) -> bool:
    """Freeze ``group`` (its row locked, or the database not yet in use) with ``reason`` and
    audit it as the shell's act. False (nothing written) when it already is frozen for another
    reason; a freeze with this very reason and time (written by the restore's SQL, in the
    restore's transaction) is only audited."""
    at = now() if at is None else at
    if group.frozen_reason is not None and (group.frozen_reason, group.frozen_at) != (reason, at):
        return False
    group.frozen_reason, group.frozen_at = reason, at
    audit.record(
        session,
        audit.shell(group.tenant_id),
        Act.BUDGET_FREEZE,
        group.id,
        {"reason": reason, "frozen_at": group.frozen_at},
    )
    return True


def _reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    if not reason or len(reason) > REASON_MAX:
        raise InvalidInput(
            f"an acknowledgement needs a reason of 1 to {REASON_MAX} characters",
            param="reason",
            code="invalid_value",
        )
    return reason


def _lift(session: Session, actor: Actor, group: BudgetGroup, reason: str) -> GroupState:
    if group.frozen_reason is None:
        session.rollback()
        raise Conflict(
            f"data set {group.id} is not frozen", param="group_id", code="budget_group_not_frozen"
        )
    detail = {"frozen_reason": group.frozen_reason, "frozen_at": group.frozen_at, "reason": reason}
    group.frozen_reason, group.frozen_at = None, None
    audit.record(session, actor, Act.BUDGET_ACKNOWLEDGE, group.id, detail)
    shown = state(group)
    session.commit()
    return shown


def acknowledge(store: Store, caller: Caller, group_id: str, reason: str | None) -> GroupState:
    """Lift the freeze of one of the caller's tenant's groups (admins only, with a reason;
    audited with the freeze it lifts). 404 for another tenant's or an unknown group, 409
    ``budget_group_not_frozen`` when it is not frozen."""
    authorize(caller, Action.LIFT_FREEZE)
    reason = _reason(reason)
    with locked_session(store.sessions) as session:
        session.get(Tenant, caller.tenant_id, with_for_update=True)  # lock order: tenant first
        owner = session.scalar(select(BudgetGroup.tenant_id).where(BudgetGroup.id == group_id))
        if owner != caller.tenant_id:
            raise NotFound(
                f"no such budget group: {group_id[:64]!r}", param="group_id", code="not_found"
            )
        return _lift(session, caller, lock_group(session, group_id), reason)


def acknowledge_on_shell(store: Store, group_id: str, reason: str | None) -> GroupState:
    """The same on the server's shell (``dprc admin acknowledge``): any tenant's group, audited
    as the shell's act."""
    reason = _reason(reason)
    with locked_session(store.sessions) as session:
        tenant_id = session.scalar(select(BudgetGroup.tenant_id).where(BudgetGroup.id == group_id))
        if tenant_id is None:
            raise NotFound(f"no such budget group: {group_id[:64]!r}", param="group_id")
        session.get(Tenant, tenant_id, with_for_update=True)
        return _lift(session, audit.shell(tenant_id), lock_group(session, group_id), reason)


def frozen_groups(session: Session) -> list[GroupState]:
    """Every frozen group, oldest freeze first."""
    rows = session.scalars(
        select(BudgetGroup)
        .where(BudgetGroup.frozen_reason.is_not(None))
        .order_by(BudgetGroup.frozen_at, BudgetGroup.seq)
    )
    return [state(g) for g in rows]
