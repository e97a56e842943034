"""Dashboard sessions, kept by the server: signing in with an API key opens one, signing out
ends it.

A session is a row of ``dashboard_sessions`` (:class:`service.store.tables.DashboardSession`) named
by the SHA-256 of a random 32-byte token; the browser's cookie holds ``v2.<token>`` (the token
in URL-safe base64, 43 characters) and the server stores only the hash, so a copy of the
database opens no session. A session counts while it has not expired (:data:`SESSION_SECONDS`
after sign-in), has not been ended by sign-out, and its API key is not revoked. Sign-in and
sign-out are written to the audit log (``session.sign_in``, ``session.sign_out``, resource the
key id) in the transaction that opens or ends the session.

A cookie value is checked against one strict pattern before anything else is done with it:
whatever else a browser (or anyone) sends is refused as ``invalid_session`` — never parsed as
a number, never compared as text of unknown characters.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Unauthenticated
from service.governance import audit
from service.governance.keys import Caller, authenticate, caller_for_key_id
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import DashboardSession

SESSION_SECONDS = 12 * 3600
VERSION = "v2"
TOKEN_BYTES = 32
# ``v2.`` and the token as secrets.token_urlsafe(32) writes it: 43 characters of [A-Za-z0-9_-]
_COOKIE = re.compile(r"v2\.([A-Za-z0-9_-]{43})", re.ASCII)
MAX_COOKIE_CHARS = 64  # looked at no further when longer


@dataclass(frozen=True)
class SignedIn:
    """A session just opened: its caller, the cookie value to set and when it expires."""

    caller: Caller
    cookie: str
    expires_at: int


def token_of(value: str) -> str | None:
    """The token of a well-formed cookie value, else None (any other value, whatever it
    holds)."""
    if len(value) > MAX_COOKIE_CHARS:
        return None
    match = _COOKIE.fullmatch(value)
    return match.group(1) if match else None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def _invalid(message: str) -> Unauthenticated:
    return Unauthenticated(message, code="invalid_session")


def sign_in(store: Store, api_key: str, request_id: str | None = None) -> SignedIn:
    """Open a session for ``api_key`` (:class:`Unauthenticated` when it is not a valid key);
    the key's expired sessions are deleted on the way."""
    with store.sessions() as session:  # a wrong key takes no write lock
        caller = authenticate(session, f"Bearer {api_key.strip()}").with_request(request_id)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    digest = token_hash(token)
    with locked_session(store.sessions) as session:
        t = now()
        session.execute(
            delete(DashboardSession).where(
                DashboardSession.key_id == caller.key_id, DashboardSession.expires_at <= t
            )
        )
        row = DashboardSession(
            token_hash=digest,
            key_id=caller.key_id,
            created_at=t,
            expires_at=t + SESSION_SECONDS,
            ended_at=None,
        )
        session.add(row)
        session.flush()
        audit.record(session, caller, audit.Act.SIGN_IN, caller.key_id, _detail(digest))
        session.commit()
    return SignedIn(caller=caller, cookie=f"{VERSION}.{token}", expires_at=row.expires_at)


def _detail(digest: str) -> dict[str, str]:
    # names the session in the audit log (sign-in and sign-out pair up); a prefix of a hash of
    # a random token opens nothing
    return {"session": digest[:16]}


def _open_session(
    session: Session, digest: str, t: int, *, lock: bool = False
) -> tuple[DashboardSession, Caller] | None:
    """The session ``digest`` names and its caller, while it counts, else None."""
    q = select(DashboardSession).where(DashboardSession.token_hash == digest)
    row = session.scalar(q.with_for_update() if lock else q)
    if row is None or row.ended_at is not None or row.expires_at <= t:
        return None
    caller = caller_for_key_id(session, row.key_id)
    if caller is None:  # the key was revoked
        return None
    return row, caller


def session_caller(store: Store, value: str) -> Caller:
    """The caller of the session a cookie value names, or :class:`Unauthenticated`
    (``invalid_session``) when the value is malformed or its session has ended, expired or
    lost its key."""
    token = token_of(value)
    if token is None:
        raise _invalid("the dashboard session cookie is not valid: sign in again")
    with store.sessions() as session:
        found = _open_session(session, token_hash(token), now())
    if found is None:
        raise _invalid(
            "the dashboard session has ended or expired, or its API key was revoked: sign in again"
        )
    return found[1]


def sign_out(store: Store, value: str, request_id: str | None = None) -> bool:
    """End the session a cookie value names; False when there was none that counted."""
    token = token_of(value)
    if token is None:
        return False
    digest = token_hash(token)
    with locked_session(store.sessions) as session:
        t = now()
        found = _open_session(session, digest, t, lock=True)
        if found is None:
            return False
        row, caller = found
        row.ended_at = t
        session.flush()
        caller = caller.with_request(request_id)
        audit.record(session, caller, audit.Act.SIGN_OUT, caller.key_id, _detail(digest))
        session.commit()
    return True
