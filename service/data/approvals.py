"""A data owner's decisions on uploads that wait for one, and the tenant's policy on who
budgets uploads (docs/governance.md, "Who sets a budget").

Only a data owner (role ``data_owner``, or an admin) creates a budget: an upload by anyone
else — a trainer's, or any upload that names no budget where one is required — is stored as
``pending`` (:func:`service.data.files.waits_for_approval`): listed, not trainable (409
``pending_approval``), with the budget its uploader asked for and an overlap report. A data
owner then

* **approves** it as a new budget group with the ε, δ and privacy unit they decide (refused
  when it shares examples with an existing group: it must join that one),
* **joins** it to an existing group (refused when it shares examples with another group, or
  when its privacy unit differs from the group's), or
* **rejects** it: its content is deleted, its record kept.

Each decision is audited (``file.approve``, ``file.reject``) in the transaction that makes it,
under the tenant's lock, so two owners deciding at once take turns and the second finds the
upload decided (409 ``not_pending``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Conflict, InvalidInput
from service.data import hash_recordings, near_copies
from service.data.budget_groups import BudgetWish, accounting_size, place, unit_of
from service.data.example_hashes import DIGEST_BYTES, Digests, HashedData
from service.data.files import (
    APPROVED,
    PENDING,
    REJECTED,
    DataSet,
    get_row,
    pending_digests,
    required_reason,
    retrieve,
)
from service.data.private_data import remove_token_stores
from service.data.user_counts import UserCounts
from service.governance import audit
from service.governance.audit import Act
from service.governance.keys import Caller
from service.governance.roles import Action, authorize
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import BudgetGroup, File, Tenant


@dataclass(frozen=True)
class Decision:
    """A data owner's approval: a new budget group (``epsilon_budget``, ``delta``: None takes
    the default 1/N^1.1) or an existing one to join (``budget_group``); ``unit``, when given,
    must be the upload's own (its lines name their users or not: the owner confirms it)."""

    reason: str
    epsilon_budget: float | None = None
    delta: float | None = None
    budget_group: str | None = None
    unit: str | None = None


def _reason(reason: str | None) -> str:
    return required_reason(reason, "a decision")


def _pending_row(session: Session, caller: Caller, file_id: str) -> File:
    session.get(Tenant, caller.tenant_id, with_for_update=True)  # lock order: tenant first
    row = get_row(session, caller, file_id, deleted=True, lock=True)
    if row.approval != PENDING or row.deleted:
        state = "deleted" if row.deleted and row.approval == PENDING else row.approval
        raise Conflict(
            f"file {row.id} is not pending approval (it is {state})",
            param="file_id",
            code="not_pending",
        )
    return row


def _hashed(row: File) -> HashedData:
    """The pending upload as :func:`service.data.budget_groups.place` takes it, from its row and
    the digests saved beside its content."""
    digests_path, raw_path, users_path, pairs_path = pending_digests(Path(row.storage_path))
    if not digests_path.exists():
        raise Conflict(
            f"the example hashes of pending file {row.id} are gone (its folder was changed "
            "outside the service); reject it and upload it again",
            param="file_id",
            code="pending_hashes_missing",
        )
    users = None
    if row.n_users is not None:
        assert row.user_field is not None and row.max_lines_per_user is not None
        users = UserCounts(row.user_field, row.n_users, row.max_lines_per_user)
    assert row.n_examples is not None and row.data_format is not None
    return HashedData(
        row.n_examples,
        row.data_format,
        Digests.load(digests_path),
        users,
        Digests.load(raw_path) if raw_path.exists() else None,
        Digests.load(users_path) if users else None,
        Digests.load(pairs_path, 2 * DIGEST_BYTES) if users else None,
    )


def _drop_digests(row: File) -> None:
    for path in pending_digests(Path(row.storage_path)):
        path.unlink(missing_ok=True)


def approve(store: Store, caller: Caller, file_id: str, decision: Decision) -> DataSet:
    """Approve a pending upload: into a new budget group, or joined to an existing one."""
    authorize(caller, Action.SET_BUDGET)
    reason = _reason(decision.reason)
    joining = decision.budget_group is not None
    if joining and (decision.epsilon_budget is not None or decision.delta is not None):
        raise InvalidInput(
            "join a budget group or name a new budget, not both: a joined upload takes the "
            "group's budget",
            param="budget_group",
            code="invalid_value",
        )
    if not joining and decision.epsilon_budget is None:
        raise InvalidInput(
            "name the new data set's epsilon_budget (and optionally delta), or the "
            "budget_group to join",
            param="epsilon_budget",
            code="invalid_value",
        )
    hash_recordings.wait_until_free(store, caller.tenant_id)  # a big upload being recorded
    with locked_session(store.sessions) as session:
        row = _pending_row(session, caller, file_id)
        hashed = _hashed(row)
        if decision.unit is not None and decision.unit != unit_of(hashed):
            raise InvalidInput(
                f"file {row.id}'s budget is per {unit_of(hashed)} (its lines "
                + ("name" if hashed.users is not None else "do not name")
                + " their users); a per-"
                f"{decision.unit} budget needs it uploaded so (docs/privacy_unit.md)",
                param="unit",
                code="privacy_unit_mismatch",
            )
        if joining:
            target = session.scalar(
                select(BudgetGroup).where(
                    BudgetGroup.id == decision.budget_group,
                    BudgetGroup.tenant_id == caller.tenant_id,
                )
            )
            if target is not None and target.epsilon_budget is None:
                raise Conflict(
                    f"budget group {target.id} has no budget: set one first (POST "
                    "/v1/files/{id}/budget on one of its files), then join uploads to it",
                    param="budget_group",
                    code="budget_group_conflict",
                )
        wish = BudgetWish(decision.epsilon_budget, decision.delta)
        placed = place(
            session,
            caller.tenant_id,
            hashed,
            wish,
            store.settings,
            into=decision.budget_group,
        )
        if not joining and placed.joined:
            raise Conflict(
                f"this upload shares examples with data set {placed.group.id}: approve it by "
                f"joining that group (budget_group={placed.group.id!r}), or reject it",
                param="budget_group",
                code="budget_group_conflict",
            )
        group = placed.group
        row.group_id, row.approval = group.id, APPROVED
        row.overlap_report = near_copies.without_texts(row.overlap_report)
        row.decided_by, row.decided_at = caller.key_id, now()
        audit.record(
            session,
            caller,
            Act.FILE_APPROVE,
            row.id,
            {
                "budget_group": group.id,
                "joined": placed.joined,
                "epsilon": group.epsilon_budget,
                "delta": group.delta,
                "unit": group.privacy_unit,
                "units": accounting_size(hashed),
                "requested_budget": row.requested_budget,
                "reason": reason,
            },
        )
        if placed.budget_set:
            audit.record(
                session,
                caller,
                Act.BUDGET_SET,
                group.id,
                {"file_id": row.id, "epsilon": group.epsilon_budget, "delta": group.delta},
            )
        session.commit()
    _drop_digests(row)
    return retrieve(store, caller, file_id)


def reject(store: Store, caller: Caller, file_id: str, reason: str | None) -> DataSet:
    """Reject a pending upload: its content and hashes are deleted, its record kept (shown
    ``approval: rejected``, ``deleted: true``)."""
    authorize(caller, Action.SET_BUDGET)
    text = _reason(reason)
    with locked_session(store.sessions) as session:
        row = _pending_row(session, caller, file_id)
        row.approval, row.deleted, row.deleted_at = REJECTED, True, now()
        row.overlap_report = near_copies.without_texts(row.overlap_report)
        row.decided_by, row.decided_at = caller.key_id, now()
        audit.record(session, caller, Act.FILE_REJECT, row.id, {"reason": text})
        session.commit()
    path = Path(row.storage_path)
    remove_token_stores(store.settings.data_dir, caller.tenant_id, path)
    path.unlink(missing_ok=True)
    _drop_digests(row)
    return retrieve(store, caller, file_id)


# -- the tenant's policy ----------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    trainers_set_budgets: bool


def policy(store: Store, caller: Caller) -> Policy:
    authorize(caller, Action.READ)
    with store.sessions() as session:
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        return Policy(bool(tenant.trainers_set_budgets))


def set_policy(
    store: Store, caller: Caller, trainers_set_budgets: bool, reason: str | None
) -> Policy:
    """Let trainers budget their own uploads, or not (an admin's act, audited with the
    setting before and after and the reason)."""
    authorize(caller, Action.MANAGE_POLICY)
    text = _reason(reason)
    with locked_session(store.sessions) as session:
        tenant = session.get(Tenant, caller.tenant_id, with_for_update=True)
        assert tenant is not None
        before = bool(tenant.trainers_set_budgets)
        tenant.trainers_set_budgets = trainers_set_budgets
        audit.record(
            session,
            caller,
            Act.POLICY_CHANGE,
            None,
            {
                "trainers_set_budgets": {"before": before, "after": trainers_set_budgets},
                "reason": text,
            },
        )
        session.commit()
    return Policy(trainers_set_budgets)
