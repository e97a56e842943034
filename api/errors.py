"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the status.

Services raise :class:`APIError` (or a subclass); the handlers registered by
:func:`install_handlers` render it, FastAPI's validation errors and HTTP errors in the same
shape so that the ``openai`` SDK raises its typed exceptions.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("dprc.api")

# The SDK retries 408/409/429/5xx unless told not to; these answers will not change on retry.
NO_RETRY = {"x-should-retry": "false"}


class APIError(Exception):
    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status


class InvalidRequest(APIError):
    status = 400


class AuthenticationError(APIError):
    status = 401
    type = "authentication_error"


class NotFound(APIError):
    status = 404


class Conflict(APIError):
    status = 409


class PayloadTooLarge(APIError):
    status = 413


class Unprocessable(APIError):
    status = 422


class RateLimited(APIError):
    status = 429
    type = "rate_limit_error"


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _render(exc: APIError) -> JSONResponse:
    headers = dict(NO_RETRY) if exc.status in (409, 429) else None
    if exc.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(
        error_body(exc.message, exc.type, exc.param, exc.code),
        status_code=exc.status,
        headers=headers,
    )


def _loc_param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form")]
    return ".".join(parts) or None


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return _render(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = _loc_param(tuple(first.get("loc", ())))
        msg = str(first.get("msg", "invalid request"))
        message = f"{param}: {msg}" if param else msg
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        return JSONResponse(
            error_body(message, "invalid_request_error", param, "invalid_value"),
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "invalid_request_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(
            error_body(str(exc.detail), type_, None, code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(DataError)
    async def _data_error(_request: Request, exc: DataError) -> JSONResponse:
        # a value the database cannot store (e.g. NUL in PostgreSQL text) is the client's
        log.info("database refused a value: %s", exc.orig)
        return JSONResponse(
            error_body("a value in the request cannot be stored (invalid characters)",
                       "invalid_request_error", None, "invalid_value"),
            status_code=400,
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(
            error_body("internal server error", "server_error", None, None), status_code=500
        )
