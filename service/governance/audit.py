"""The audit log: one append-only entry per act of a key (key create/revoke, sign-in/out,
upload, delete, budget set/change/freeze/acknowledge, job create/cancel/pause/resume,
downloads), chained per tenant by SHA-256 so that a changed, removed or inserted entry is
found by recomputing the chain (:func:`entry_hash`; ``dprc audit verify`` does it on the
client, from the API's listing).

An entry is written in the transaction of the act it records, as that transaction's last
statement: the chain's head row (``audit_heads``) is locked last, after every row lock the act
took, so the audit joins no lock cycle; ``UNIQUE (tenant_id, prev_hash)`` keeps the chain from
forking whatever the concurrency. Nothing updates or deletes an entry.

The hash of an entry is SHA-256 over the UTF-8 bytes of the JSON array
``[prev_hash, id, created_at, key_id, role, action, resource, request_id, detail]`` written
with sorted keys, no spaces (``separators=(",", ":")``) and ``ensure_ascii=True``; ``detail``
is the JSON object itself (parsed from its stored text). The first entry's ``prev_hash`` is 64
zeros. ``key_id`` is null and ``role`` is ``"shell"`` for an act on the server's shell
(``dprc keys create|revoke``, ``dprc admin restore|acknowledge``), which no key makes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.ids import new_id
from service.base.pagination import cursor_page
from service.governance.roles import Action, authorize
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import AuditEntry, AuditHead

if TYPE_CHECKING:
    from service.governance.caller import Caller

GENESIS = "0" * 64
SHELL_ROLE = "shell"


class Actor(Protocol):
    """Who acts: a :class:`service.governance.caller.Caller` (a key), or the server's shell
    (:func:`shell`: no key, role ``"shell"``)."""

    @property
    def tenant_id(self) -> int: ...

    @property
    def key_id(self) -> str | None: ...

    @property
    def role(self) -> str: ...

    @property
    def request_id(self) -> str | None: ...


@dataclass(frozen=True)
class ShellActor:
    tenant_id: int
    key_id: str | None = None
    role: str = SHELL_ROLE
    request_id: str | None = None


def shell(tenant_id: int) -> ShellActor:
    """The server's shell acting on ``tenant_id``'s keys."""
    return ShellActor(tenant_id=tenant_id)


class Act:
    """The actions an entry records (its ``action``)."""

    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    SIGN_IN = "session.sign_in"
    SIGN_OUT = "session.sign_out"
    FILE_UPLOAD = "file.upload"
    FILE_DELETE = "file.delete"
    FILE_DOWNLOAD = "file.download"
    FILE_APPROVE = "file.approve"  # a data owner approved a pending upload (service/approvals)
    FILE_REJECT = "file.reject"  # ... or rejected it (its content deleted, its record kept)
    POLICY_CHANGE = "policy.change"  # the tenant's settings (service/data/approvals.py)
    BUDGET_SET = "budget.set"
    BUDGET_CHANGE = "budget.change"
    BUDGET_FREEZE = "budget.freeze"  # a restore froze a data set (service/budget/freezes.py)
    BUDGET_ACKNOWLEDGE = "budget.acknowledge"  # an admin lifted that freeze
    JOB_CREATE = "job.create"
    JOB_CANCEL = "job.cancel"
    JOB_PAUSE = "job.pause"
    JOB_RESUME = "job.resume"
    CHECKPOINT_DOWNLOAD = "checkpoint.download"
    RESULT_DOWNLOAD = "result.download"
    LEDGER_DOWNLOAD = "ledger.download"


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def entry_hash(
    prev_hash: str,
    entry_id: str,
    created_at: int,
    key_id: str | None,
    role: str | None,
    action: str,
    resource: str | None,
    request_id: str | None,
    detail: dict[str, Any],
) -> str:
    payload = [prev_hash, entry_id, created_at, key_id, role, action, resource, request_id, detail]
    return hashlib.sha256(canonical(payload).encode("ascii")).hexdigest()


def record(
    session: Session,
    caller: Actor,
    action: str,
    resource: str | None,
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    """Append the entry of ``caller``'s act to its tenant's chain, in ``session``'s transaction
    (the caller commits). Call it after every other lock of the transaction was taken."""
    head = session.scalar(
        select(AuditHead).where(AuditHead.tenant_id == caller.tenant_id).with_for_update()
    )
    if head is None:
        head = AuditHead(tenant_id=caller.tenant_id, last_hash=GENESIS, count=0)
        session.add(head)
        session.flush()  # a concurrent first entry makes one of the two fail: never a fork
    body = dict(detail or {})
    entry = AuditEntry(
        id=new_id("audit"),
        tenant_id=caller.tenant_id,
        created_at=now(),
        key_id=caller.key_id,
        role=caller.role,
        action=action,
        resource=resource,
        request_id=caller.request_id,
        detail=canonical(body),
        prev_hash=head.last_hash,
    )
    entry.hash = entry_hash(
        entry.prev_hash,
        entry.id,
        entry.created_at,
        entry.key_id,
        entry.role,
        entry.action,
        entry.resource,
        entry.request_id,
        body,
    )
    session.add(entry)
    head.last_hash = entry.hash
    head.count = head.count + 1
    session.flush()
    return entry


def record_alone(
    store: Store,
    caller: Actor,
    action: str,
    resource: str | None,
    detail: dict[str, Any] | None = None,
) -> None:
    """An entry in a transaction of its own (an act that changes nothing else, such as a
    download: recorded before the content is sent)."""
    with locked_session(store.sessions) as session:
        record(session, caller, action, resource, detail)
        session.commit()


@dataclass(frozen=True)
class AuditFilter:
    action: str | None = None
    key_id: str | None = None
    resource: str | None = None
    since: int | None = None  # created_at >= since
    until: int | None = None  # created_at < until


def list_entries(
    store: Store, caller: Caller, filters: AuditFilter, after: str | None, limit: int
) -> tuple[list[Entry], bool]:
    """A page of the tenant's entries, oldest first (admins only)."""
    authorize(caller, Action.READ_AUDIT_LOG)
    with store.sessions() as session:
        q = select(AuditEntry).where(AuditEntry.tenant_id == caller.tenant_id)
        if filters.action is not None:
            q = q.where(AuditEntry.action == filters.action)
        if filters.key_id is not None:
            q = q.where(AuditEntry.key_id == filters.key_id)
        if filters.resource is not None:
            q = q.where(AuditEntry.resource == filters.resource)
        if filters.since is not None:
            q = q.where(AuditEntry.created_at >= filters.since)
        if filters.until is not None:
            q = q.where(AuditEntry.created_at < filters.until)
        rows, has_more = cursor_page(
            session, q, AuditEntry, after, limit, "audit_entry", descending=False
        )
        return [as_entry(r) for r in rows], has_more


def detail_of(entry: AuditEntry) -> dict[str, Any]:
    """An entry's detail as its JSON object; a stored text that is not one (a row changed
    behind the service's back) is shown as ``{"unparsable": text}``, whose hash will not match."""
    try:
        value = json.loads(entry.detail)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"unparsable": entry.detail}


@dataclass(frozen=True)
class Entry:
    """An entry as the API shows it: every hashed field, and the hash."""

    id: str
    created_at: int
    key_id: str | None
    role: str | None
    action: str
    resource: str | None
    request_id: str | None
    detail: dict[str, Any]
    prev_hash: str
    hash: str


def as_entry(row: AuditEntry) -> Entry:
    return Entry(
        id=row.id,
        created_at=row.created_at,
        key_id=row.key_id,
        role=row.role,
        action=row.action,
        resource=row.resource,
        request_id=row.request_id,
        detail=detail_of(row),
        prev_hash=row.prev_hash,
        hash=row.hash,
    )
