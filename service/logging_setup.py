"""The one logging configuration of the service's processes (``dprc serve``, the Celery
workers): a stderr handler on the root logger at ``DPRC_LOG_LEVEL``, so that every module's
``logging.getLogger(__name__)`` reaches the output — the embedded worker's lines included."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_HANDLER_NAME = "dprc"


def configure_logging(level: str) -> None:
    """Set the root logger to ``level`` (a name such as ``info``) with one stderr handler.
    Calling it again only changes the level."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    if not any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    root.setLevel(numeric)
