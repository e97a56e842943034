"""HTTP errors, OpenAI-style: ``{"error": {"message", "type", "param", "code"}}`` with a status.

The one place that maps the domain errors of :mod:`service.base.errors` (raised by the services)
to status codes; the handlers registered by :func:`install_handlers` render them, FastAPI's
validation errors and HTTP errors in the same shape so that the ``openai`` SDK raises its typed
exceptions.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.base.errors import (
    Conflict,
    DomainError,
    InvalidInput,
    LimitReached,
    NotFound,
    PermissionDenied,
    TooLarge,
    Unauthenticated,
)
from service.store.store import StoreError, StoreValueRefused, is_contention

log = logging.getLogger(__name__)

# The SDK retries 408/409/429/5xx unless told not to; these answers will not change on retry.
NO_RETRY = {"x-should-retry": "false"}

INVALID_REQUEST = "invalid_request_error"

# Domain error class -> (HTTP status, OpenAI error type); the first match in MRO order wins.
STATUS: dict[type[DomainError], tuple[int, str]] = {
    InvalidInput: (400, INVALID_REQUEST),
    Unauthenticated: (401, "authentication_error"),
    PermissionDenied: (403, "permission_error"),
    NotFound: (404, INVALID_REQUEST),
    Conflict: (409, INVALID_REQUEST),
    TooLarge: (413, INVALID_REQUEST),
    LimitReached: (429, "rate_limit_error"),
}


class StrictInputRoute(APIRoute):
    """A route whose invalid input (FastAPI's validation of its body, form or query) is a 400
    naming the field, like the domain's own refusals, rather than FastAPI's 422: the routes
    that set budgets, whose callers must not tell a malformed number from a refused one by
    the status."""

    validation_status = 400


def status_of(exc: DomainError) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400, INVALID_REQUEST


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _render(exc: DomainError) -> JSONResponse:
    status, type_ = status_of(exc)
    headers = dict(NO_RETRY) if status in (409, 429) else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(
        error_body(exc.message, type_, exc.param, exc.code),
        status_code=status,
        headers=headers,
    )


# pydantic names the member of a union that failed in the error's location ("int",
# "literal['auto']", "function-after[...]"); a request's field names never look like that
_UNION_MEMBERS = frozenset({"int", "float", "str", "bool", "none", "dict", "list"})


def _loc_param(loc: tuple[Any, ...]) -> str | None:
    parts = [
        str(p)
        for p in loc
        if p not in ("body", "query", "path", "header", "form")
        and not (isinstance(p, str) and (p in _UNION_MEMBERS or "[" in p))
    ]
    return ".".join(parts) or None


def _not_json_body(request: Request, first: Any) -> JSONResponse | None:
    """415 for a JSON endpoint's body sent without ``Content-Type: application/json`` (as
    ``curl -d`` does: it sends ``application/x-www-form-urlencoded``), which FastAPI does not
    parse, instead of a vague 422 about the body's type."""
    if tuple(first.get("loc", ())) != ("body",) or first.get("type") == "missing":
        return None
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    got = f"Content-Type {content_type[:80]!r}" if content_type else "no Content-Type"
    return JSONResponse(
        error_body(
            f"this endpoint takes a JSON body with Content-Type: application/json; the request "
            f"has {got} (with curl: -H 'Content-Type: application/json' -d '{{...}}')",
            INVALID_REQUEST,
            None,
            "unsupported_media_type",
        ),
        status_code=415,
        headers=dict(NO_RETRY),
    )


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain_error(_request: Request, exc: DomainError) -> JSONResponse:
        return _render(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        not_json = _not_json_body(request, first)
        if not_json is not None:
            return not_json
        param = _loc_param(tuple(first.get("loc", ())))
        msg = str(first.get("msg", "invalid request"))
        message = f"{param}: {msg}" if param else msg
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        route = request.scope.get("route")
        return JSONResponse(
            error_body(message, INVALID_REQUEST, param, "invalid_value"),
            status_code=getattr(route, "validation_status", 422),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = INVALID_REQUEST
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(
            error_body(str(exc.detail), type_, None, code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(StoreValueRefused)
    async def _data_error(_request: Request, exc: StoreValueRefused) -> JSONResponse:
        # a value the database cannot store (e.g. NUL in PostgreSQL text) is the client's
        log.info("database refused a value: %s", exc.orig)
        return JSONResponse(
            error_body(
                "a value in the request cannot be stored (invalid characters)",
                INVALID_REQUEST,
                None,
                "invalid_value",
            ),
            status_code=400,
        )

    @app.exception_handler(StoreError)
    async def _store_busy(_request: Request, exc: StoreError) -> JSONResponse:
        # contention is not a server fault: the request changed nothing, retry
        if not is_contention(exc):
            log.exception("database error", exc_info=exc)
            return JSONResponse(
                error_body("internal server error", "server_error", None, None), status_code=500
            )
        log.warning("store busy: %s", exc.orig)
        return JSONResponse(
            error_body(
                "the service is busy with other writes; nothing was changed, retry the request",
                "server_error",
                None,
                "store_busy",
            ),
            status_code=503,
            headers={"Retry-After": "1", "x-should-retry": "true"},
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(
            error_body("internal server error", "server_error", None, None), status_code=500
        )
