"""The client: the official ``openai`` package against ``<server>/v1`` (files, jobs, events,
checkpoints, cancel, pause, resume, streamed completions) and its raw ``get``/``post`` with the
same base URL and key for dprc's own endpoints (budget, ledger, accountant, audit log) and for
whole completion objects (as the server answers them, every field kept). Every answer is a
plain JSON-like dict; every failure is a :class:`ClientError` with one line for the user.

The SDK (``openai``, ``httpx``: about 0.3 s to import) is imported when a client is made or an
error described, not with this module: the commands' parsers, their ``--help`` and their usage
errors start without it (docs/benchmarks/client_startup.md)."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dprc.client.config import ClientConfig

if TYPE_CHECKING:
    import openai

GENERATION_PATHS = {"chat": "/chat/completions", "complete": "/completions"}


class ClientError(RuntimeError):
    """An HTTP error (the server's OpenAI-style error, in one line) or no connection."""


def _plain(obj: Any) -> Any:
    """An SDK object (extras included) as plain JSON data."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    return obj


def describe_error(exc: openai.APIError, server_url: str) -> str:
    import openai

    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return f"cannot reach the dprc server at {server_url}: {cause}"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        message = body.get("message") or exc.response.text[:300] or exc.message
        code = body.get("code")
        param = body.get("param")
        where = f" (param {param})" if param else ""
        return f"HTTP {exc.status_code}{' ' + code if code else ''}: {message}{where}"
    return str(exc)


class Client:
    def __init__(self, config: ClientConfig, timeout: float = 120.0, max_retries: int = 2):
        import openai

        self.config = config
        self.sdk = openai.OpenAI(
            base_url=f"{config.server_url}/v1",
            api_key=config.api_key,
            timeout=timeout,
            max_retries=max_retries,
        )

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        import openai

        try:
            return _plain(fn(*args, **kw))
        except openai.APIError as exc:
            raise ClientError(describe_error(exc, self.config.server_url)) from None

    def _get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        return self._call(self.sdk.get, path, cast_to=object, options={"params": query})

    def _post(self, path: str, body: dict[str, Any] | None = None, **kw: Any) -> Any:
        return self._call(self.sdk.post, path, body=body, cast_to=object, **kw)

    # -- files
    def upload(
        self,
        path: Path,
        purpose: str,
        epsilon_budget: float | None,
        delta: float | None,
        unbudgeted: bool = False,
        user_field: str | None = None,
    ) -> dict[str, Any]:
        extra = {
            k: repr(v)
            for k, v in (("epsilon_budget", epsilon_budget), ("delta", delta))
            if v is not None
        }
        if unbudgeted:
            extra["unbudgeted"] = "true"
        if user_field is not None:
            extra["user_field"] = user_field
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise ClientError(f"cannot read {path}: {exc}") from None
        return self._call(
            self.sdk.files.create,
            file=(path.name, content),
            purpose=purpose,  # dprc accepts its own purposes
            extra_body=extra or None,
        )

    def list_files(
        self, purpose: str | None = None, approval: str | None = None
    ) -> list[dict[str, Any]]:
        return self._get("/files", purpose=purpose, approval=approval)["data"]

    def approve(self, file_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """A data owner's approval of a pending upload (docs/governance.md)."""
        return self._post(f"/files/{file_id}/approve", body)

    def reject(self, file_id: str, reason: str) -> dict[str, Any]:
        return self._post(f"/files/{file_id}/reject", {"reason": reason})

    def get_file(self, file_id: str) -> dict[str, Any]:
        return self._call(self.sdk.files.retrieve, file_id)

    def delete_file(self, file_id: str) -> dict[str, Any]:
        return self._call(self.sdk.files.delete, file_id)

    def file_content(self, file_id: str) -> bytes:
        import openai

        try:
            return self.sdk.files.content(file_id).read()
        except openai.APIError as exc:
            raise ClientError(describe_error(exc, self.config.server_url)) from None

    def set_budget(
        self, file_id: str, epsilon: float | None, delta: float | None, reason: str
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"reason": reason}
        if epsilon is not None:
            body["epsilon_budget"] = epsilon
        if delta is not None:
            body["delta"] = delta
        return self._post(f"/files/{file_id}/budget", body)

    # -- jobs
    def create_job(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """``POST /fine_tuning/jobs`` with an Idempotency-Key (a fresh one by default), so the
        SDK's retries after a time-out never create or reserve twice."""
        key = idempotency_key or f"dprc-cli-{uuid.uuid4()}"
        return self._post("/fine_tuning/jobs", body, options={"headers": {"Idempotency-Key": key}})

    def list_jobs(self, limit: int, after: str | None = None) -> dict[str, Any]:
        return self._get("/fine_tuning/jobs", limit=limit, after=after)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._call(self.sdk.fine_tuning.jobs.retrieve, job_id)

    def events(self, job_id: str, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        kw: dict[str, Any] = {"limit": limit}
        if after is not None:
            kw["after"] = after
        return self._call(self.sdk.fine_tuning.jobs.list_events, job_id, **kw)

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """Every checkpoint of the job (all pages)."""
        out: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = self._get(f"/fine_tuning/jobs/{job_id}/checkpoints", limit=100, after=after)
            out += page["data"]
            if not page["has_more"] or not page["data"]:
                return out
            after = page["data"][-1]["id"]

    def ledger(self, job_id: str) -> dict[str, Any]:
        return self._get(f"/fine_tuning/jobs/{job_id}/ledger")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call(self.sdk.fine_tuning.jobs.cancel, job_id)

    def pause(self, job_id: str) -> dict[str, Any]:  # raw: older SDKs have no jobs.pause
        return self._post(f"/fine_tuning/jobs/{job_id}/pause")

    def resume(self, job_id: str) -> dict[str, Any]:
        return self._post(f"/fine_tuning/jobs/{job_id}/resume")

    # -- generation
    def generate(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """The server's whole completion object (``kind``: ``chat`` or ``complete``): the JSON
        it answers, as it answers it."""
        return self._post(GENERATION_PATHS[kind], {**body, "stream": False})

    def generate_stream(self, kind: str, body: dict[str, Any]) -> Generator[str, None, None]:
        """The text of the first choice as the server streams it (``stream: true``), piece by
        piece; closing the iterator closes the connection, which ends the generation there."""
        import httpx
        import openai

        create: Any = (
            self.sdk.chat.completions.create if kind == "chat" else self.sdk.completions.create
        )
        try:
            with create(**body, stream=True) as stream:
                for chunk in stream:
                    for choice in chunk.choices:
                        if choice.index != 0:
                            continue
                        text = choice.delta.content if kind == "chat" else choice.text
                        if text:
                            yield text
        except openai.APIError as exc:
            raise ClientError(describe_error(exc, self.config.server_url)) from None
        except httpx.HTTPError as exc:  # the connection broke off during the answer
            raise ClientError(
                f"the answer from {self.config.server_url} broke off: {exc or type(exc).__name__}"
            ) from None

    # -- accountant
    def accountant(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        path = {"epsilon": "/accountant/epsilon", "sigma": "/accountant/noise_multiplier"}[kind]
        return self._post(path, body)

    # -- audit log
    def audit_logs(
        self, filters: dict[str, Any], after: str | None = None, limit: int = 1000
    ) -> dict[str, Any]:
        """One page of the tenant's audit log, oldest first (admins only)."""
        return self._get("/organization/audit_logs", **filters, after=after, limit=limit)

    def all_audit_logs(self, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every entry (all pages), oldest first."""
        out: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = self.audit_logs(filters or {}, after=after)
            out += page["data"]
            if not page["has_more"] or not page["data"]:
                return out
            after = page["data"][-1]["id"]
