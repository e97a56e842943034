"""Dashboard sessions: a signed cookie naming an API key, never the key itself.

Signing in posts an API key once; the server checks it (:func:`service.keys.authenticate`)
and sets the cookie ``dprc_session = v1.<key id>.<expiry>.<HMAC-SHA256>``, HttpOnly,
SameSite=Strict, Path=/ (Secure over https). The HMAC key is a random secret in the data
folder (``dashboard.secret``, written 0600 once, shared by every API process of that data
folder). A cookie is honoured while it has not expired *and* its API key is not revoked:
revoking a key ends its dashboard sessions.

A request authenticated by the cookie that changes something (any method but GET, HEAD,
OPTIONS) must carry the header ``X-DPRC-Dashboard: 1`` and, when the browser sends one, an
``Origin`` equal to the request's own: a cross-site page can send neither without a CORS
pre-flight, which this app never grants (and SameSite=Strict keeps the cookie off cross-site
requests in the first place).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from pathlib import Path

from fastapi import Request

from service.errors import Unauthenticated
from service.keys import Caller, caller_for_key_id

COOKIE = "dprc_session"
CSRF_HEADER = "x-dprc-dashboard"
SESSION_SECONDS = 12 * 3600
SECRET_FILE = "dashboard.secret"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_secrets: dict[Path, bytes] = {}
_secrets_guard = threading.Lock()


def _secret(data_dir: Path) -> bytes:
    """The data folder's signing secret, created (0600, exclusively) on first use."""
    path = (data_dir / SECRET_FILE).resolve()
    with _secrets_guard:
        if path in _secrets:
            return _secrets[path]
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            value = bytes.fromhex(path.read_text().strip())
        else:
            value = secrets.token_bytes(32)
            with os.fdopen(fd, "w") as out:
                out.write(value.hex())
        if len(value) < 32:
            raise RuntimeError(f"{path} holds a secret shorter than 32 bytes; delete it")
        _secrets[path] = value
        return value


def _mac(secret: bytes, key_id: str, expiry: int) -> str:
    return hmac.new(secret, f"v1.{key_id}.{expiry}".encode(), hashlib.sha256).hexdigest()


def issue(data_dir: Path, key_id: str, now: float | None = None) -> str:
    """A cookie value for ``key_id``, valid for :data:`SESSION_SECONDS`."""
    expiry = int(now if now is not None else time.time()) + SESSION_SECONDS
    return f"v1.{key_id}.{expiry}.{_mac(_secret(data_dir), key_id, expiry)}"


def key_id_of(data_dir: Path, value: str, now: float | None = None) -> str | None:
    """The key id a cookie value names, or None if it is malformed, forged or expired."""
    parts = value.split(".")
    if len(parts) != 4 or parts[0] != "v1" or not parts[2].isdigit():
        return None
    _, key_id, expiry_text, mac = parts
    expiry = int(expiry_text)
    if not hmac.compare_digest(mac, _mac(_secret(data_dir), key_id, expiry)):
        return None
    if expiry < (now if now is not None else time.time()):
        return None
    return key_id


def session_caller(request: Request) -> Caller | None:
    """The caller of a request signed in by cookie, or None when it carries no cookie. A cookie
    that is forged, expired or whose key was revoked is :class:`Unauthenticated`."""
    value = request.cookies.get(COOKIE)
    if not value:
        return None
    store = request.app.state.store
    key_id = key_id_of(store.settings.data_dir, value)
    if key_id is None:
        raise Unauthenticated(
            "the dashboard session is invalid or expired: sign in again",
            code="invalid_session",
        )
    with store.sessions() as session:
        caller = caller_for_key_id(session, key_id)
    if caller is None:
        raise Unauthenticated(
            "the API key of this dashboard session has been revoked", code="invalid_session"
        )
    return caller


def same_origin(request: Request) -> bool:
    """True unless the request carries an ``Origin`` other than its own host's."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def check_csrf(request: Request) -> None:
    """Refuse a cookie-authenticated request that changes something without the dashboard's
    header or from another origin."""
    if request.method in SAFE_METHODS:
        return
    if request.headers.get(CSRF_HEADER) != "1" or not same_origin(request):
        raise Unauthenticated(
            f"a request signed in by the dashboard cookie that changes something needs the "
            f"header '{CSRF_HEADER}: 1' and a same-origin Origin",
            code="csrf_check_failed",
        )
