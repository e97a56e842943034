"""A size limit on every request body, enforced before the app (and authentication) reads it.

A body is refused with 413 as soon as it is known to be too large: from its ``Content-Length``,
or, without one (chunked), once the bytes received pass the limit. The limit is
``max_upload_bytes`` plus room for the multipart framing on ``POST /v1/files``,
``max_part_bytes`` plus that room on ``POST /v1/uploads/{id}/parts`` (an upload's part) and
``max_request_bytes`` (1 MiB by default) everywhere else — so hostile bodies cannot fill the
API's memory or disk, authenticated or not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from api.errors import error_body

MULTIPART_SLACK = 1 << 20  # form fields and boundaries around the uploaded file
PART_PATH = re.compile(r"/v1/uploads/[^/]+/parts/?")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        max_upload_bytes: int,
        max_request_bytes: int,
        max_part_bytes: int | None = None,
    ):
        self.app = app
        self.upload = max_upload_bytes
        self.request = max_request_bytes
        self.part = max_part_bytes if max_part_bytes is not None else max_upload_bytes

    def limit(self, scope: Scope) -> tuple[int, str, str | None]:
        """(bytes, what, param) for this request."""
        if scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/files":
            return self.upload + MULTIPART_SLACK, f"the upload limit of {self.upload}", "file"
        if scope["method"] == "POST" and PART_PATH.fullmatch(scope["path"]):
            return self.part + MULTIPART_SLACK, f"the part limit of {self.part}", "data"
        return self.request, f"the request size limit of {self.request}", None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, what, param = self.limit(scope)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > limit:
            await _refuse(send, what, param)
            return
        seen = 0
        exceeded = refused = False

        async def counted() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLarge  # whatever the app makes of it, the answer is the 413
            return message

        async def answer(message: Message) -> None:
            nonlocal refused
            if not exceeded:
                await send(message)
            elif not refused:  # the app's own answer to the broken read is replaced
                refused = True
                await _refuse(send, what, param)

        try:
            await self.app(scope, counted, answer)
        except _TooLarge:
            pass
        if exceeded and not refused:
            await _refuse(send, what, param)


async def _refuse(send: Send, what: str, param: str | None) -> None:
    body = json.dumps(
        error_body(
            f"the request body exceeds {what} bytes",
            "invalid_request_error",
            param,
            "file_too_large" if param in ("file", "data") else "request_too_large",
        )
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
