"""Relaying a completion request to the engine that serves its model, and its answer back.

**Routes.** With ``vllm_url`` set, ``vllm_model`` (an allow-listed model the vLLM server
serves under that name) and the LoRA fine-tunes whose adapter sits on it go to vLLM: an
adapter is registered once with vLLM's ``POST /v1/load_lora_adapter`` (its folder must be on
storage the vLLM server reads at the same path). Everything else goes to the embedded engine
(``python -m inference``, the same protocol; full fine-tunes are model folders there), unless
``inference_engine`` is ``off``: then 400 ``model_not_served``.

**Answers.** The engine's JSON or its server-sent events are passed on as they come (the
``model`` they name is the public name: engines know models by it). Its refusals become
OpenAI-shaped errors with their status (vLLM's ``{"object": "error", …}`` included); 429
keeps its ``Retry-After``. A client that goes away closes the engine's connection, which ends
its generation and frees its slot. Prompts and outputs are never logged."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.base.settings import Settings
from service.inference.engine_process import EngineAddress, EngineProcess, EngineUnavailable
from service.inference.targets import ServedModel

log = logging.getLogger(__name__)

MAX_ERROR_BYTES = 64 * 1024
READ_TIMEOUT_S = 900.0  # a long generation's first byte (non-streamed: its whole answer)


@dataclass(frozen=True)
class Route:
    """Where a model is served: the engine's address, its kind, and the registration body that
    makes the model known there (None: it knows it already, vLLM's own model)."""

    address: EngineAddress
    kind: str  # "embedded" | "vllm"
    register: dict[str, str] | None


@dataclass
class EngineError(Exception):
    """An engine's refusal or failure, in OpenAI's error fields."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Reply:
    """A whole (non-streamed) answer."""

    body: dict[str, Any]


@dataclass
class Stream:
    """A streamed answer: server-sent event bytes as the engine sends them; ``close`` ends it
    (and the engine's generation) whenever the client leaves."""

    chunks: AsyncIterator[bytes]
    response: httpx.Response

    async def close(self) -> None:
        await self.response.aclose()


def _vllm_serves(settings: Settings, served: ServedModel) -> bool:
    if not settings.vllm_url or not settings.vllm_model:
        return False
    if served.lora:
        return served.base_name == settings.vllm_model
    return served.name == settings.vllm_model


class Relay:
    """One per API process: the engine process (started on first use), an HTTP client, and the
    models each engine has been told about."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = EngineProcess(settings)
        self._client: httpx.AsyncClient | None = None
        self._registered: dict[str, set[str]] = {}  # engine URL -> model names it knows

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(connect=10.0, read=READ_TIMEOUT_S, write=30.0, pool=30.0)
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        await asyncio.to_thread(self.engine.stop)

    async def route(self, served: ServedModel) -> Route:
        s = self.settings
        if _vllm_serves(s, served):
            assert s.vllm_url is not None
            address = EngineAddress(s.vllm_url.rstrip("/"), s.vllm_api_key)
            body = {"lora_name": served.name, "lora_path": str(served.path)}
            return Route(address, "vllm", body if served.lora else None)
        if s.inference_url:
            address = EngineAddress(s.inference_url.rstrip("/"), s.inference_token)
        elif s.inference_engine == "embedded":
            try:
                address = await asyncio.to_thread(self.engine.address)
            except EngineUnavailable as exc:
                raise EngineError(
                    503,
                    str(exc),
                    "server_error",
                    None,
                    "engine_unavailable",
                    {"Retry-After": "10"},
                ) from exc
        else:
            raise EngineError(
                400,
                f"the model {served.name!r} is not served here: this server generates with "
                f"vLLM only ({s.vllm_model!r} and its LoRA fine-tunes)",
                param="model",
                code="model_not_served",
            )
        body = {"lora_name": served.name, "lora_path": str(served.path)}
        if served.base_path is not None:
            body["base_model_path"] = str(served.base_path)
        return Route(address, "embedded", body)

    def _headers(self, address: EngineAddress) -> dict[str, str]:
        return {"Authorization": f"Bearer {address.token}"} if address.token else {}

    async def _register(self, route: Route, name: str) -> None:
        known = self._registered.setdefault(route.address.url, set())
        if route.register is None or name in known:
            return
        try:
            response = await self.client.post(
                f"{route.address.url}/v1/load_lora_adapter",
                json=route.register,
                headers=self._headers(route.address),
            )
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc
        if response.status_code != 200 and not _already_loaded(response):
            raise _error_of(response.status_code, response.content, response.headers)
        known.add(name)

    async def send(self, path: str, body: dict[str, Any], served: ServedModel) -> Reply | Stream:
        """``body`` (already checked) to the engine serving ``served`` at ``path``
        (``/v1/chat/completions`` or ``/v1/completions``)."""
        route = await self.route(served)
        body = {**body, "model": served.name}
        for attempt in (0, 1):
            await self._register(route, served.name)
            request = self.client.build_request(
                "POST",
                f"{route.address.url}{path}",
                json=body,
                headers=self._headers(route.address),
            )
            try:
                response = await self.client.send(request, stream=True)
            except httpx.HTTPError as exc:
                self._registered.pop(route.address.url, None)  # a restarted engine forgot them
                raise _unreachable(exc) from exc
            if response.status_code == 200:
                if body.get("stream"):
                    return Stream(response.aiter_raw(), response)
                try:
                    data = await response.aread()
                finally:
                    await response.aclose()
                return Reply(json.loads(data))
            content = await _read_some(response)
            error = _error_of(response.status_code, content, response.headers)
            if error.status == 404 and attempt == 0 and route.register is not None:
                # the engine restarted (or evicted its registration): tell it again, once
                self._registered.get(route.address.url, set()).discard(served.name)
                continue
            raise error
        raise AssertionError("unreachable")


async def _read_some(response: httpx.Response) -> bytes:
    out = bytearray()
    try:
        async for chunk in response.aiter_raw():
            out += chunk
            if len(out) > MAX_ERROR_BYTES:
                break
    finally:
        await response.aclose()
    return bytes(out[:MAX_ERROR_BYTES])


def _already_loaded(response: httpx.Response) -> bool:
    """vLLM answers 400 to a second registration of a name ("has already been loaded")."""
    return response.status_code == 400 and b"already" in response.content


def _unreachable(exc: Exception) -> EngineError:
    log.warning("the generation engine did not answer: %s", type(exc).__name__)
    return EngineError(
        503,
        "the generation engine did not answer; try again shortly",
        "server_error",
        None,
        "engine_unavailable",
        {"Retry-After": "5"},
    )


def _error_of(status: int, content: bytes, headers: httpx.Headers) -> EngineError:
    """An engine's error answer in OpenAI's fields: ``{"error": {...}}`` (OpenAI, the embedded
    engine) or vLLM's ``{"object": "error", "message", "type", "code"}``."""
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    fields: dict[str, Any] = {}
    if isinstance(data, dict):
        inner = data.get("error")
        fields = inner if isinstance(inner, dict) else data
    message = fields.get("message")
    kept = {"Retry-After": headers["retry-after"]} if "retry-after" in headers else {}
    if status in (401, 403):  # the server's credentials for the engine, never the caller's
        log.error("the generation engine refused this server's token (status %d)", status)
        return EngineError(
            502,
            "the generation engine refused this server's credentials (its operator must set "
            "DPRC_INFERENCE_TOKEN or DPRC_VLLM_API_KEY to the engine's token)",
            "server_error",
            None,
            "engine_error",
        )
    if status >= 500:
        log.warning("the generation engine failed with status %d", status)
        return EngineError(
            502,
            f"the generation engine failed (status {status})",
            "server_error",
            None,
            "engine_error",
            kept,
        )
    type_ = fields.get("type") if isinstance(fields.get("type"), str) else None
    if type_ is None or not type_.endswith("_error"):
        type_ = "rate_limit_error" if status == 429 else "invalid_request_error"
    code = fields.get("code")
    return EngineError(
        status,
        str(message)[:2000] if message else f"the generation engine refused (status {status})",
        type_,
        fields.get("param") if isinstance(fields.get("param"), str) else None,
        code if isinstance(code, str) else None,
        kept,
    )
