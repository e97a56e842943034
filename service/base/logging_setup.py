"""The one logging configuration of the service's processes (``dprc serve``, the Celery
workers): a stderr handler on the root logger at ``DPRC_LOG_LEVEL``, so that every module's
``logging.getLogger(__name__)`` reaches the output — the embedded worker's lines included.

``DPRC_LOG_FORMAT=json`` writes one JSON object a line: ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message`` and, where known, ``request_id`` (the request's ``X-Request-ID``),
``tenant``, ``key_id`` and ``job_id`` (:func:`log_context`, :func:`bind`), and ``exception``
(the traceback) for a logged exception. What the service logs never holds a key, a cookie, a
seed or a line of data (tests/worker/test_json_logs.py greps a whole run's log for them)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
CONTEXT_FIELDS = ("request_id", "tenant", "key_id", "job_id")
_HANDLER_NAME = "dprc"

# The fields of what is being done now. The API's middleware gives each request a fresh dict
# (its copies of the context, e.g. in the thread pool that runs its endpoint, share the dict,
# so a field set while authenticating is seen by the endpoint's lines); a worker binds its job.
_context: ContextVar[dict[str, Any] | None] = ContextVar("dprc_log_context", default=None)


@contextmanager
def log_context(**fields: Any) -> Iterator[dict[str, Any]]:
    """A fresh context for what runs inside (a request, a job), starting with ``fields``."""
    token = _context.set({k: v for k, v in fields.items() if v is not None})
    try:
        yield _context.get() or {}
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add fields to the current context (no effect outside one)."""
    ctx = _context.get()
    if ctx is not None:
        ctx.update({k: v for k, v in fields.items() if v is not None})


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Set the root logger to ``level`` (a name such as ``info``) with one stderr handler
    writing ``fmt`` (text | json), Python warnings included. Calling it again changes the level
    and the format."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (one of {FORMATS})")
    root = logging.getLogger()
    handler = next((h for h in root.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.addFilter(_ContextFilter())
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(FORMAT))
    root.setLevel(numeric)
    # Python warnings (a LearnabilityWarning, a library's deprecation) are log records of the
    # ``py.warnings`` logger, in the same format, instead of raw lines on stderr
    logging.captureWarnings(True)
