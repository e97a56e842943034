"""The engine's settings: command-line flags, the bearer token from the environment."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

TOKEN_ENV = "DPRC_INFERENCE_TOKEN"
GIB = 2**30


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8001
    cache_bytes: int = 4 * GIB  # --cache-bytes: loaded models' parameter + buffer bytes
    max_batch: int = 8  # --max-batch: sequences decoded at once ("slots")
    max_queue: int = 64  # --max-queue: requests waiting for a slot; beyond it, 429
    max_new_tokens_limit: int = 4096  # --max-new-tokens-limit: the largest max_tokens taken
    max_body_bytes: int = 2**20  # --max-body-bytes: a request body's size limit
    token: str | None = None  # DPRC_INFERENCE_TOKEN: the bearer token, when set
    log_level: str = "info"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> Settings:
    d = Settings()
    ap = argparse.ArgumentParser(
        prog="python -m inference",
        description="dprc's embedded generation engine: an OpenAI-compatible HTTP server "
        f"(docs/inference_engine.md). The bearer token is read from ${TOKEN_ENV}.",
    )
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port)
    ap.add_argument("--cache-bytes", type=_positive, default=d.cache_bytes)
    ap.add_argument("--max-batch", type=_positive, default=d.max_batch)
    ap.add_argument("--max-queue", type=_positive, default=d.max_queue)
    ap.add_argument("--max-new-tokens-limit", type=_positive, default=d.max_new_tokens_limit)
    ap.add_argument("--max-body-bytes", type=_positive, default=d.max_body_bytes)
    ap.add_argument("--log-level", default=d.log_level, choices=["debug", "info", "warning"])
    a = ap.parse_args(argv)
    return Settings(
        host=a.host,
        port=a.port,
        cache_bytes=a.cache_bytes,
        max_batch=a.max_batch,
        max_queue=a.max_queue,
        max_new_tokens_limit=a.max_new_tokens_limit,
        max_body_bytes=a.max_body_bytes,
        token=os.environ.get(TOKEN_ENV) or None,
        log_level=a.log_level,
    )
