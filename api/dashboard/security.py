"""Headers on every dashboard response: a strict Content-Security-Policy (scripts, styles,
images and requests from this origin only; no inline script or style, no frames, no plugins),
no sniffing, no referrer to other sites (with ``no-referrer`` Chromium would post forms
with ``Origin: null``), no framing, no caching of pages."""

from __future__ import annotations

from typing import TypeVar

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


R = TypeVar("R", bound=Response)


def secure(response: R, cache: bool = False) -> R:
    response.headers.update(HEADERS)
    if not cache:
        response.headers["Cache-Control"] = "no-store"
    return response


class SecureStaticFiles(StaticFiles):
    """The dashboard's JS and CSS, with the same headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        return secure(response, cache=False)
