"""The FastAPI application: routers per domain under ``/v1``, OpenAI-style errors,
migrations applied at start-up. The dispatcher that hands jobs to workers is injected by the
process that composes the app (``dprc serve``, see :mod:`dprc.app`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import dprc_core
from api.accountant.router import router as accountant_router
from api.body_limit import BodyLimit
from api.completions.router import router as completions_router
from api.dashboard.router import mount_dashboard
from api.errors import error_body, install_handlers
from api.files.router import router as files_router
from api.jobs.router import router as jobs_router
from api.keys.router import router as keys_router
from api.metrics import install_metrics
from api.models.router import router as models_router
from api.organization.router import router as organization_router
from api.synthetic.router import router as synthetic_router
from api.uploads.router import router as uploads_router
from service.base.ids import new_id
from service.base.logging_setup import log_context
from service.base.settings import Settings, get_settings
from service.budget import planning
from service.data import uploads
from service.data.rekey import open_current_store
from service.inference.relay import Relay
from service.jobs.dispatch import Dispatcher, NoDispatcher
from service.jobs.model_checks import warm_model_checks
from service.store.store import Store, ping, readiness

DispatcherFactory = Callable[[Store], Dispatcher]
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
log = logging.getLogger(__name__)


def _no_dispatcher(_store: Store) -> Dispatcher:
    return NoDispatcher()


UPLOAD_SWEEP_SECONDS = 60


async def _sweep_uploads(store: Store) -> None:
    """Expire the uploads past their expiry and delete their parts, every minute (or every
    ``DPRC_UPLOAD_EXPIRY_SECONDS`` when shorter) while the API runs."""
    interval = min(UPLOAD_SWEEP_SECONDS, store.settings.upload_expiry_seconds)
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(uploads.sweep_expired, store)
        except Exception:  # noqa: BLE001 - logged; the next round tries again
            log.exception("the sweep of expired uploads failed")


def create_app(
    settings: Settings | None = None, dispatcher: DispatcherFactory = _no_dispatcher
) -> FastAPI:
    """The app; at start-up it opens the store and builds its dispatcher with
    ``dispatcher(store)`` (default: none, jobs wait for a worker's sweep)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = open_current_store(settings)
        process = planning.accountant_process(settings)
        if process is not None:  # its imports (about a second) before the first create
            process.start()
        if settings.warm_model_checks:  # before the first request: no create pays the imports
            await asyncio.to_thread(warm_model_checks, settings)
        app.state.dispatcher = dispatcher(app.state.store)
        app.state.relay = Relay(settings)  # generation: its engine starts on first use
        sweeper = asyncio.create_task(_sweep_uploads(app.state.store))
        yield
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        await app.state.relay.aclose()
        app.state.dispatcher.stop()
        app.state.store.engine.dispose()

    app = FastAPI(
        title="dprc",
        version=dprc_core.__version__,
        description="Differentially private fine-tuning: an OpenAI-compatible fine-tuning API "
        "with privacy budgets and a privacy accountant.",
        lifespan=lifespan,
        docs_url=None,  # served below from local assets: no CDN
        redoc_url=None,
    )
    install_handlers(app)
    _add_docs_pages(app)

    # NUL can be stored by neither PostgreSQL text nor file names: refused up front (a plain
    # ASGI layer: no BaseHTTPMiddleware task between a streamed answer and its client)
    app.add_middleware(RefuseNul)

    # outermost of the app's own layers: a body's size is checked before anything reads it
    app.add_middleware(
        BodyLimit,
        max_upload_bytes=settings.max_upload_bytes,
        max_request_bytes=settings.max_request_bytes,
        max_part_bytes=settings.max_upload_part_bytes,
    )
    install_metrics(app, settings)  # requests counted outside the body limit: refusals too
    # outside it: every response (a refusal included) carries its X-Request-ID, and every log
    # line written while the request is served (uvicorn's access line too) its request id
    app.add_middleware(RequestContext)

    for router in (
        files_router,
        uploads_router,
        jobs_router,
        models_router,
        completions_router,
        accountant_router,
        keys_router,
        organization_router,
        synthetic_router,
    ):
        app.include_router(router)
    mount_dashboard(app)  # the web dashboard: pages at /, static files, its own CSP

    @app.get("/healthz", tags=["health"])
    def healthz(request: Request) -> JSONResponse:
        checks: dict[str, str] = {}
        ok = True
        try:
            ping(request.app.state.store)
            checks["store"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            ok, checks["store"] = False, f"error: {type(exc).__name__}"
        if settings.broker_url:
            checks["broker"] = _ping_broker(settings.broker_url)
            ok = ok and checks["broker"] == "ok"
        return JSONResponse(
            {"status": "ok" if ok else "error", "checks": checks}, status_code=200 if ok else 503
        )

    @app.get("/readyz", tags=["health"])
    def readyz(request: Request) -> JSONResponse:
        """Ready to serve: the database answers and is at the code's migration head, and the
        broker (when configured) answers; 503 with the failing check otherwise."""
        checks = readiness(request.app.state.store)
        if settings.broker_url:
            checks["broker"] = _ping_broker(settings.broker_url)
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse(
            {"status": "ok" if ok else "error", "checks": checks}, status_code=200 if ok else 503
        )

    return app


class RefuseNul:
    """400 for a NUL character in the path or the query string, before the app sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            query = scope.get("query_string", b"").decode("latin-1")
            if "\x00" in path or "%00" in query or "\x00" in unquote(query):
                body = error_body(
                    "NUL characters are not allowed in paths or query parameters",
                    "invalid_request_error",
                    None,
                    "invalid_value",
                )
                await JSONResponse(body, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestContext:
    """The request's id — the client's ``X-Request-ID`` when it is a plain token, else a new
    one — on ``request.state.request_id`` (the audit log records it), echoed on the response,
    and in the log context (:func:`service.base.logging_setup.log_context`) while it is served."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID.fullmatch(given) else new_id("req")
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        with log_context(request_id=rid):
            await self.app(scope, receive, send_with_id)


DOCS_ASSETS = "/docs-assets"


def _add_docs_pages(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from assets served by this app (the
    ``fastapi-offline`` package's copies, MIT), so both work with no Internet access; no
    external host is referenced (no CDN, no Google fonts)."""
    import fastapi_offline
    from fastapi.openapi.docs import (
        get_redoc_html,
        get_swagger_ui_html,
        get_swagger_ui_oauth2_redirect_html,
    )
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    static = Path(fastapi_offline.__file__).parent / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=static), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    favicon = f"{DOCS_ASSETS}/favicon.png"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=favicon,
            swagger_ui_parameters={"validatorUrl": None},  # else it calls validator.swagger.io
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )


def _ping_broker(url: str) -> str:
    """PING a Redis broker over a raw socket (no client library needed)."""
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=2
        ) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
        return (
            "ok"
            if reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")
            else (f"error: unexpected reply {reply[:20]!r}")
        )
    except OSError as exc:
        return f"error: {type(exc).__name__}"
