"""``GET /metrics``: Prometheus exposition of the service's metrics (:mod:`service.store.metrics`)
and of this API's requests — counted by route template, method and status, with a latency
histogram — behind a bearer token (``DPRC_METRICS_TOKEN``; unset: ``/metrics`` is 404)."""

from __future__ import annotations

import hmac
import time
from typing import cast

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body
from service.base.settings import Settings
from service.store import metrics
from service.store.store import Store


class RequestMetrics:
    """An ASGI layer counting each HTTP request by its route's template (``/v1/files/{file_id}``,
    never the ids themselves; ``unmatched`` for no route), method and status, and timing it."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.requests = Counter(
            "dprc_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "dprc_http_request_duration_seconds",
            "HTTP request latency by route template and method",
            ["route", "method"],
            registry=registry,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def record_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            self.requests.labels(route, method, str(status[0])).inc()
            self.latency.labels(route, method).observe(time.perf_counter() - started)


def install_metrics(app: FastAPI, settings: Settings) -> None:
    """The request counter and ``GET /metrics`` (the store's gauges read from the app's store,
    opened at start-up)."""
    registry = CollectorRegistry()  # the store's gauges are not collected on registration
    registry.register(metrics.StoreCollector(lambda: cast(Store, app.state.store)))
    app.add_middleware(RequestMetrics, registry=registry)
    token = settings.metrics_token

    @app.get("/metrics", include_in_schema=False)
    def metrics_page(request: Request) -> Response:
        if not token:
            return _refused(404, "metrics are off: set DPRC_METRICS_TOKEN", "not_found")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _refused(
                401, "/metrics needs Authorization: Bearer <DPRC_METRICS_TOKEN>", "invalid_token"
            )
        body = generate_latest(registry) + generate_latest(metrics.REGISTRY)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def _refused(status: int, message: str, code: str) -> Response:
    return JSONResponse(error_body(message, "invalid_request_error", None, code), status)
