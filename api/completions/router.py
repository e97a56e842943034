"""``POST /v1/chat/completions`` and ``POST /v1/completions`` with the caller's tenant's models
(an allow-listed causal LM or its ``ft:`` models), relayed to the engine that serves them
(:mod:`service.inference.relay`) and answered in OpenAI's shapes, ``stream`` included."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.app_state import get_store
from api.completions.schemas import ChatCompletionRequest, CompletionRequest, Sampling
from api.errors import NO_RETRY, StrictInputRoute, error_body
from api.keys.dependencies import CallerDep
from service.governance.keys import Caller
from service.inference import targets
from service.inference.relay import EngineError, Relay, Reply, Stream

router = APIRouter(prefix="/v1", tags=["completions"], route_class=StrictInputRoute)

DISCONNECT_POLL_S = 0.25
T = TypeVar("T")


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, caller: CallerDep
) -> Response:
    return await _generate(request, caller, body, "/v1/chat/completions")


@router.post("/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, caller: CallerDep
) -> Response:
    return await _generate(request, caller, body, "/v1/completions")


def get_relay(request: Request) -> Relay:
    return request.app.state.relay


async def _generate(request: Request, caller: Caller, body: Sampling, path: str) -> Response:
    served = await asyncio.to_thread(targets.served_model, get_store(request), caller, body.model)
    try:
        answer = await _unless_gone(
            request, get_relay(request).send(path, body.engine_body(), served)
        )
    except EngineError as exc:
        headers = {**exc.headers, **(NO_RETRY if exc.status == 400 else {})}
        return JSONResponse(
            error_body(exc.message, exc.type, exc.param, exc.code),
            status_code=exc.status,
            headers=headers,
        )
    if answer is None:  # the client left before the answer began
        return Response(status_code=204)
    if isinstance(answer, Reply):
        return JSONResponse(answer.body)
    return StreamingResponse(
        _events(answer),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _unless_gone(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or None once the client has disconnected (``work`` is then
    cancelled: its connection to the engine closes, which ends the generation there)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    answer = await task
                    if isinstance(answer, Stream):
                        await answer.close()
                return None
    finally:
        if not task.done():
            task.cancel()


async def _events(stream: Stream) -> AsyncIterator[bytes]:
    """The engine's events as they come; a stream the engine breaks off ends with an error
    event (the client raises it) rather than silently."""
    try:
        async for chunk in stream.chunks:
            yield chunk
    except httpx.HTTPError:
        error = error_body(
            "the generation engine stopped answering", "server_error", None, "engine_error"
        )
        yield f"data: {json.dumps(error)}\n\n".encode()
    finally:
        await stream.close()
