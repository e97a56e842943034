"""The dashboard's session cookie over HTTP; the sessions themselves are the server's
(:mod:`service.governance.dashboard_sessions`).

Signing in posts an API key once; the server opens a session and sets the cookie
``dprc_session = v2.<random token>``, HttpOnly, SameSite=Strict, Path=/, Max-Age 12 h, and
``Secure`` when the dashboard is reached over https (:func:`cookie_secure`). A request with the
cookie counts while its session does (not expired, not signed out, its key not revoked); any
other cookie value is 401 ``invalid_session`` on the API and a redirect to the sign-in page on
a page.

A request authenticated by the cookie that changes something (any method but GET, HEAD,
OPTIONS) must carry the header ``X-DPRC-Dashboard: 1`` and, when the browser sends one, an
``Origin`` equal to the request's own: a cross-site page can send neither without a CORS
pre-flight, which this app never grants (and SameSite=Strict keeps the cookie off cross-site
requests in the first place).
"""

from __future__ import annotations

import ipaddress

from fastapi import Request
from starlette.responses import Response

from service.base.errors import Unauthenticated
from service.base.settings import Settings
from service.governance import dashboard_sessions
from service.governance.dashboard_sessions import SESSION_SECONDS
from service.governance.keys import Caller

COOKIE = "dprc_session"
CSRF_HEADER = "x-dprc-dashboard"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def session_caller(request: Request) -> Caller | None:
    """The caller of a request signed in by cookie, or None when it carries no cookie. A cookie
    that is malformed, or whose session ended, expired or lost its key, is
    :class:`Unauthenticated` (``invalid_session``)."""
    value = request.cookies.get(COOKIE)
    if value is None:
        return None
    return dashboard_sessions.session_caller(request.app.state.store, value)


def _trusted(peer: str | None, proxies: list[str]) -> bool:
    """Whether ``peer`` is one of ``proxies`` (addresses or networks such as 10.0.0.0/24)."""
    if not peer or not proxies:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:  # a Unix socket's path, a test client's name
        return peer in proxies
    for entry in proxies:
        try:
            if address in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


def cookie_secure(request: Request, settings: Settings) -> bool:
    """``Secure`` on the session cookie: the service's public URL is https, or the request
    came over https itself, or through a trusted proxy (the direct peer is in
    ``settings.trusted_proxies``) that says so with ``X-Forwarded-Proto: https``. A client's
    own ``X-Forwarded-Proto`` from any other address counts for nothing."""
    if (settings.public_url or "").strip().lower().startswith("https://"):
        return True
    if request.url.scheme == "https":
        return True
    peer = request.client.host if request.client else None
    if not _trusted(peer, settings.trusted_proxies):
        return False
    # the nearest proxy's word is the last of a list
    proto = request.headers.get("x-forwarded-proto", "").rsplit(",", 1)[-1]
    return proto.strip().lower() == "https"


def set_cookie(response: Response, request: Request, settings: Settings, value: str) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request, settings),
    )


def clear_cookie(response: Response, request: Request, settings: Settings) -> None:
    response.delete_cookie(
        COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request, settings),
    )


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
