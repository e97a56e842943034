"""Tenants and their API keys: high-entropy random secrets stored as SHA-256 hashes, compared
in constant time; the caller a key (or a dashboard session's key id) stands for."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, replace

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.clock import now
from service.errors import Unauthenticated
from service.ids import new_id
from service.roles import DEFAULT_ROLE, Role, parse_role
from service.tables import ApiKey, Tenant

KEY_PREFIX = "dprc-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who makes a request: the key's tenant, the key and its role (:mod:`service.roles`), and
    the request's id (``X-Request-ID``) that the audit log records."""

    tenant_id: int
    tenant_name: str
    key_id: str
    role: str
    request_id: str | None = None

    def with_request(self, request_id: str | None) -> Caller:
        return replace(self, request_id=request_id)


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
            tenant = session.scalar(select(Tenant).where(Tenant.name == name))
            assert tenant is not None
    return tenant


def create_key(
    session: Session, tenant_name: str, role: str | Role = DEFAULT_ROLE, name: str | None = None
) -> tuple[str, str]:
    """Create a key of ``role`` for ``tenant_name`` (created if new), on the server's shell.
    Returns (key id, secret key)."""
    tenant = get_or_create_tenant(session, tenant_name)
    key, secret = new_key(tenant.id, parse_role(str(role)), name, created_by=None)
    session.add(key)
    session.commit()
    return key.id, secret


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


def revoke_key(session: Session, key_id: str) -> bool:
    key = session.get(ApiKey, key_id)
    if key is None:
        return False
    if key.revoked_at is None:
        key.revoked_at = now()
        session.commit()
    return True


@dataclass(frozen=True)
class KeyInfo:
    """A key as ``dprc keys list`` prints it (never its secret)."""

    id: str
    tenant: str
    prefix: str
    created_at: int
    revoked_at: int | None
    role: str
    name: str | None


def list_keys(session: Session) -> list[KeyInfo]:
    """Every key, oldest first."""
    rows = session.execute(
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .order_by(ApiKey.created_at, ApiKey.id)
    )
    return [
        KeyInfo(
            id=k.id,
            tenant=name,
            prefix=k.prefix,
            created_at=k.created_at,
            revoked_at=k.revoked_at,
            role=k.role,
            name=k.name,
        )
        for k, name in rows
    ]


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
