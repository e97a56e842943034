"""The HTTP side: OpenAI-compatible routes over the :class:`~inference.engine.Engine`.

Handlers are async: they validate the body, :meth:`~inference.engine.Engine.submit` a job and
await its events (an ``asyncio.Queue`` the generation thread fills). A client that goes away
(a closed stream, a dropped connection) cancels its job, which frees its rows at the next step.
Prompts and outputs are never logged."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference.engine import Engine, Job
from inference.errors import APIError, bad_request, error_body
from inference.models import ModelCache, check_registration
from inference.protocol import (
    ChatRequest,
    CompletionRequest,
    LoadAdapter,
    Sampling,
    UnloadAdapter,
    parse_chat,
    parse_completion,
    parse_model,
)
from inference.settings import Settings


class Disconnected(Exception):
    pass


def create_app(settings: Settings) -> FastAPI:
    cache = ModelCache(settings.cache_bytes)
    engine = Engine(cache, max_batch=settings.max_batch, max_queue=settings.max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        engine.stop()

    app = FastAPI(title="dprc inference engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail), code), status_code=exc.status_code
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, "invalid request"), status_code=400)

    async def authorized(request: Request) -> None:
        if settings.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), settings.token.encode()
        ):
            raise APIError(401, "a valid bearer token is required", "invalid_api_key")

    auth = [Depends(authorized)]

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            raise APIError(413, f"the body is over {settings.max_body_bytes} bytes", "too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > settings.max_body_bytes:
                raise APIError(
                    413, f"the body is over {settings.max_body_bytes} bytes", "too_large"
                )
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError):
            raise bad_request("the body is not valid JSON") from None

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict[str, Any]:
        data = [
            {"id": r.name, "object": "model", "created": r.created, "owned_by": "dprc"}
            for r in cache.registrations()
        ]
        return {"object": "list", "data": data}

    @app.get("/stats", dependencies=auth)
    async def stats() -> dict[str, Any]:
        return engine.stats()

    @app.post("/v1/load_lora_adapter", dependencies=auth)
    async def load_adapter(request: Request) -> PlainTextResponse:
        body = parse_model(LoadAdapter, await read_json(request))
        reg = check_registration(body.lora_name, body.lora_path, body.base_model_path)
        cache.register(reg)
        return PlainTextResponse(f"Success: LoRA adapter '{reg.name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", dependencies=auth)
    async def unload_adapter(request: Request) -> PlainTextResponse:
        body = parse_model(UnloadAdapter, await read_json(request))
        cache.unregister(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    def submit(req: Sampling, **prompt: Any) -> Job:
        max_new = req.new_tokens()
        if max_new is not None and max_new > settings.max_new_tokens_limit:
            raise bad_request(
                f"max_tokens={max_new} is over this engine's limit of "
                f"{settings.max_new_tokens_limit}",
                param="max_tokens",
            )
        if req.n > settings.max_batch:
            raise bad_request(f"n must be at most {settings.max_batch} here", param="n")
        if cache.registration(req.model) is None:
            raise APIError(
                404, f"the model {req.model!r} does not exist", "model_not_found", "model"
            )
        job = Job(
            model=req.model,
            loop=asyncio.get_running_loop(),
            max_new=max_new,
            temperature=req.temperature,
            top_p=req.top_p,
            n=req.n,
            stop=req.stops(),
            seed=req.seed,
            ignore_eos=req.ignore_eos,
            **prompt,
        )
        engine.submit(job)
        return job

    async def watch(request: Request, job: Job) -> None:
        """Wait for the client to go away; then cancel ``job`` and wake its handler."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                engine.cancel(job)
                job.events.put_nowait(("disconnected",))
                return

    async def next_event(job: Job) -> tuple[Any, ...]:
        event = await job.events.get()
        if event[0] == "disconnected":
            raise Disconnected
        return event

    async def run(request: Request, req: Sampling, chat: bool, job: Job) -> Response:
        watcher = asyncio.create_task(watch(request, job))
        try:
            return await respond(req, chat, job)
        except Disconnected:
            return Response(status_code=499)
        finally:
            watcher.cancel()  # a streamed response watches the connection itself

    async def respond(req: Sampling, chat: bool, job: Job) -> Response:
        first = await next_event(job)
        if first[0] == "error":
            raise first[1]
        prompt_tokens = first[1]
        rid = ("chatcmpl-" if chat else "cmpl-") + job.id
        created = int(time.time())
        if req.stream:
            return StreamingResponse(
                stream(job, req, chat, rid, created, prompt_tokens),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        texts = [""] * req.n
        reasons: list[str | None] = [None] * req.n
        while True:
            event = await next_event(job)
            if event[0] == "text":
                texts[event[1]] += event[2]
            elif event[0] == "end":
                reasons[event[1]] = event[2]
            elif event[0] == "error":
                raise event[1]
            elif event[0] == "done":
                usage = _usage(event[1], event[2])
                break
        if chat:
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": texts[i]},
                    "logprobs": None,
                    "finish_reason": reasons[i],
                }
                for i in range(req.n)
            ]
            obj = "chat.completion"
        else:
            choices = [
                {"index": i, "text": texts[i], "logprobs": None, "finish_reason": reasons[i]}
                for i in range(req.n)
            ]
            obj = "text_completion"
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": req.model,
                "choices": choices,
                "usage": usage,
            }
        )

    async def stream(
        job: Job, req: Sampling, chat: bool, rid: str, created: int, prompt_tokens: int
    ) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": req.model}

        def chunk(index: int, content: str | None, reason: str | None = None) -> bytes:
            if chat:
                delta: dict[str, Any] = (
                    {"role": "assistant"}
                    if content is None
                    else ({"content": content} if content else {})
                )
                choice: dict[str, Any] = {"index": index, "delta": delta}
            else:
                choice = {"index": index, "text": content or ""}
            choice["logprobs"] = None
            choice["finish_reason"] = reason
            return _sse({**head, "choices": [choice]})

        finished = False
        try:
            if chat:
                yield b"".join(chunk(i, None) for i in range(req.n))
            while True:
                events = [await job.events.get()]
                while not job.events.empty():
                    events.append(job.events.get_nowait())
                out: list[bytes] = []
                for event in events:
                    if event[0] == "text":
                        out.append(chunk(event[1], event[2]))
                    elif event[0] == "end":
                        out.append(chunk(event[1], "", event[2]))
                    elif event[0] == "error":  # after the headers: an error event, then [DONE]
                        out.append(_sse(event[1].body()))
                        finished = True
                    elif event[0] == "done":
                        if req.wants_usage():
                            out.append(
                                _sse({**head, "choices": [], "usage": _usage(event[1], event[2])})
                            )
                        finished = True
                if finished:
                    out.append(b"data: [DONE]\n\n")
                yield b"".join(out)
                if finished:
                    return
        finally:
            if not finished:
                engine.cancel(job)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request) -> Response:
        req: ChatRequest = parse_chat(await read_json(request))
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        job = submit(req, messages=messages)
        return await run(request, req, True, job)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request) -> Response:
        req: CompletionRequest = parse_completion(await read_json(request))
        job = submit(req, prompt=req.prompt_text())
        return await run(request, req, False, job)

    return app


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


__all__ = ["create_app"]
