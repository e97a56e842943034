"""Tenants and their API keys: high-entropy random secrets stored as SHA-256 hashes, compared
in constant time; the caller a key (or a dashboard session's key id) stands for; and the
management of keys — on the server's shell (:func:`create_key`, :func:`revoke_key`,
:func:`list_keys`) and by a tenant's admins over HTTP (:func:`create_api_key`,
:func:`revoke_api_key`, :func:`list_api_keys`). Every creation and revocation is recorded in
the tenant's audit log (:mod:`service.governance.audit`) in its own transaction; over HTTP a
tenant's
last active admin key cannot be revoked, so a tenant never locks itself out (the shell, whose
operator can always make a new key, may)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import Engine, and_, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, NotFound, Unauthenticated
from service.base.ids import new_id
from service.governance import audit
from service.governance.caller import Caller
from service.governance.roles import DEFAULT_ROLE, Action, Role, authorize, parse_role
from service.store.db import is_sqlite, locked_session
from service.store.store import Store
from service.store.tables import ApiKey, Tenant

KEY_PREFIX = "dprc-"
MAX_NAME = 128


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class KeyInfo:
    """A key as it is shown (never its secret): ``dprc keys list`` and the HTTP listing."""

    id: str
    tenant: str
    prefix: str
    created_at: int
    revoked_at: int | None
    role: str
    name: str | None
    created_by: str | None = None
    revoked_by: str | None = None


def _info(key: ApiKey, tenant: str) -> KeyInfo:
    return KeyInfo(
        id=key.id,
        tenant=tenant,
        prefix=key.prefix,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
        role=key.role,
        name=key.name,
        created_by=key.created_by,
        revoked_by=key.revoked_by,
    )


def check_name(name: str | None) -> str | None:
    """A key's optional label: 1 to 128 characters, no control characters."""
    if name is None:
        return None
    if not name or len(name) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidInput(
            f"name must be 1 to {MAX_NAME} characters without control characters",
            param="name",
            code="invalid_value",
        )
    return name


def _write_lock(session: Session) -> None:
    """Begin ``session``'s transaction holding SQLite's write lock (as
    :func:`service.store.db.locked_session`), for the shell's functions that are handed a session:
    the audit entry they append must not race another writer."""
    bind = session.get_bind()
    if isinstance(bind, Engine) and is_sqlite(bind) and not session.in_transaction():
        session.connection(execution_options={"sqlite_immediate": True})


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    name = name.strip()
    if not name or len(name) > 128 or "\x00" in name:
        raise ValueError("tenant name must be 1 to 128 characters")
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(name=name, created_at=now())
        session.add(tenant)
        try:
            session.flush()
        except IntegrityError:  # created concurrently
            session.rollback()
            _write_lock(session)
            tenant = session.scalar(select(Tenant).where(Tenant.name == name))
            assert tenant is not None
    return tenant


# -- the server's shell -----------------------------------------------------------------------


def create_key(
    session: Session, tenant_name: str, role: str | Role = DEFAULT_ROLE, name: str | None = None
) -> tuple[str, str]:
    """Create a key of ``role`` for ``tenant_name`` (created if new), on the server's shell,
    and record it in the tenant's audit log (actor: the shell). Returns (key id, secret)."""
    checked_role = parse_role(str(role))
    checked_name = check_name(name)
    _write_lock(session)
    tenant = get_or_create_tenant(session, tenant_name)
    key, secret = new_key(tenant.id, checked_role, checked_name, created_by=None)
    session.add(key)
    session.flush()
    audit.record(session, audit.shell(tenant.id), audit.Act.KEY_CREATE, key.id, _detail(key))
    session.commit()
    return key.id, secret


def revoke_key(session: Session, key_id: str) -> bool:
    """Revoke a key on the server's shell (any tenant's, its last admin key included: the
    shell can always make a new one) and record it; False when there is no such key."""
    _write_lock(session)
    key = session.scalar(select(ApiKey).where(ApiKey.id == key_id).with_for_update())
    if key is None:
        return False
    if key.revoked_at is None:
        key.revoked_at = now()
        key.revoked_by = None
        session.flush()
        audit.record(
            session, audit.shell(key.tenant_id), audit.Act.KEY_REVOKE, key.id, _detail(key)
        )
        session.commit()
    return True


def list_keys(session: Session) -> list[KeyInfo]:
    """Every key, oldest first."""
    rows = session.execute(
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .order_by(ApiKey.created_at, ApiKey.id)
    )
    return [_info(k, name) for k, name in rows]


def new_key(
    tenant_id: int, role: Role, name: str | None, created_by: str | None
) -> tuple[ApiKey, str]:
    """A new key's row (not yet added) and its secret, shown once."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        tenant_id=tenant_id,
        key_hash=hash_key(secret),
        prefix=secret[: len(KEY_PREFIX) + 4],
        created_at=now(),
        role=role.value,
        name=name,
        created_by=created_by,
    )
    return key, secret


def _detail(key: ApiKey) -> dict[str, str | None]:
    return {"role": key.role, "name": key.name}


# -- a tenant's admins, over HTTP -------------------------------------------------------------


def create_api_key(
    store: Store, caller: Caller, role: str | None, name: str | None
) -> tuple[KeyInfo, str]:
    """An admin creates a key of ``role`` (default trainer) for its own tenant. Returns the
    key and its secret, which is shown this once."""
    authorize(caller, Action.MANAGE_KEYS)
    checked_role = parse_role(role) if role is not None else DEFAULT_ROLE
    checked_name = check_name(name)
    with locked_session(store.sessions) as session:
        key, secret = new_key(caller.tenant_id, checked_role, checked_name, caller.key_id)
        session.add(key)
        session.flush()
        audit.record(session, caller, audit.Act.KEY_CREATE, key.id, _detail(key))
        session.commit()
    return _info(key, caller.tenant_name), secret


def revoke_api_key(store: Store, caller: Caller, key_id: str) -> str:
    """An admin revokes one of its tenant's keys (itself included), unless it is the tenant's
    last active admin key (:class:`Conflict` ``last_admin``). Revoking a revoked key changes
    nothing. Another tenant's key is :class:`NotFound`, as an unknown one."""
    authorize(caller, Action.MANAGE_KEYS)
    with locked_session(store.sessions) as session:
        # lock order: the tenant's row (it serializes the tenant's revocations, so two admins
        # revoking each other cannot both pass the last-admin check), then the audit head
        session.get(Tenant, caller.tenant_id, with_for_update=True)
        key = session.scalar(
            select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == caller.tenant_id)
        )
        if key is None:
            raise NotFound(f"no such API key: {key_id[:64]!r}", param="key_id", code="not_found")
        if key.revoked_at is not None:
            return key.id
        if key.role == Role.ADMIN.value and _active_admins(session, caller.tenant_id) <= 1:
            raise Conflict(
                f"{key.id} is the tenant's last active admin key: create another admin key "
                "first, so that the tenant keeps a key that can manage keys",
                param="key_id",
                code="last_admin",
            )
        key.revoked_at = now()
        key.revoked_by = caller.key_id
        session.flush()
        audit.record(session, caller, audit.Act.KEY_REVOKE, key.id, _detail(key))
        session.commit()
        return key.id


def _active_admins(session: Session, tenant_id: int) -> int:
    count = session.scalar(
        select(func.count())
        .select_from(ApiKey)
        .where(
            ApiKey.tenant_id == tenant_id,
            ApiKey.role == Role.ADMIN.value,
            ApiKey.revoked_at.is_(None),
        )
    )
    return int(count or 0)


def list_api_keys(
    store: Store, caller: Caller, after: str | None, limit: int
) -> tuple[list[KeyInfo], bool]:
    """A page of the tenant's keys, oldest first (admins only), after the key ``after``."""
    authorize(caller, Action.MANAGE_KEYS)
    with store.sessions() as session:
        q = select(ApiKey).where(ApiKey.tenant_id == caller.tenant_id)
        if after:
            anchor = session.scalar(q.where(ApiKey.id == after))
            if anchor is None:
                raise NotFound(
                    f"no such API key: {after[:64]!r}", param="after", code="api_key_not_found"
                )
            # keys have no sequence number: (created_at, id) orders them, ties included
            q = q.where(
                or_(
                    ApiKey.created_at > anchor.created_at,
                    and_(ApiKey.created_at == anchor.created_at, ApiKey.id > anchor.id),
                )
            )
        rows = list(session.scalars(q.order_by(ApiKey.created_at, ApiKey.id).limit(limit + 1)))
    return [_info(k, caller.tenant_name) for k in rows[:limit]], len(rows) > limit


def authenticate(session: Session, authorization: str | None) -> Caller:
    """The caller for an ``Authorization: Bearer <key>`` header, or :class:`Unauthenticated`."""
    if not authorization:
        raise Unauthenticated(
            "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key"
        )
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise Unauthenticated("malformed Authorization header", code="invalid_api_key")
    digest = hash_key(secret)
    row = session.execute(
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.key_hash == digest)
    ).first()
    # compare in constant time even though the lookup is by hash (defence in depth)
    if row is None or not hmac.compare_digest(row[0].key_hash, digest):
        raise Unauthenticated("incorrect API key provided", code="invalid_api_key")
    key, tenant_name = row
    if key.revoked_at is not None:
        raise Unauthenticated("this API key has been revoked", code="invalid_api_key")
    return Caller(tenant_id=key.tenant_id, tenant_name=tenant_name, key_id=key.id, role=key.role)


def caller_for_key_id(session: Session, key_id: str) -> Caller | None:
    """The caller of the key ``key_id`` (a signed dashboard session's), or None when the key
    does not exist or has been revoked."""
    row = session.execute(
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.id == key_id)
    ).first()
    if row is None or row[0].revoked_at is not None:
        return None
    key, tenant_name = row
    return Caller(tenant_id=key.tenant_id, tenant_name=tenant_name, key_id=key.id, role=key.role)
