"""The embedded generation engine as a child process of the API: ``python -m inference`` on a
free 127.0.0.1 port with a random bearer token, started on the first completion request (an
API that never generates never loads torch for it), started again if it died, stopped with the
API. Its models, batching and limits are its own (docs/inference_engine.md)."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx

from service.base.settings import Settings

log = logging.getLogger(__name__)
MAX_NEW_TOKENS = 32_768  # the API's own bound on max_tokens (api/completions/schemas.py)


@dataclass(frozen=True)
class EngineAddress:
    """Where an engine answers and the token it wants."""

    url: str
    token: str | None


class EngineUnavailable(RuntimeError):
    """The engine did not start (or answer) in time; the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineProcess:
    """The engine child process of one API process (one per app)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._address: EngineAddress | None = None

    def address(self) -> EngineAddress:
        """The running engine's address, starting it (and waiting for its /health) if it is
        not running. Blocking: call it from a thread."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._address:
                return self._address
            if self._proc is not None:
                log.warning(
                    "the generation engine exited (status %s); starting it again",
                    self._proc.returncode,
                )
            return self._start()

    def _start(self) -> EngineAddress:
        s = self.settings
        port, token = _free_port(), secrets.token_urlsafe(32)
        argv = [
            sys.executable,
            "-m",
            "inference",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cache-bytes",
            str(s.inference_cache_bytes),
            "--max-batch",
            str(s.inference_max_batch),
            "--max-queue",
            str(s.inference_max_queue),
            "--max-new-tokens-limit",
            str(MAX_NEW_TOKENS),
        ]
        env = {
            **os.environ,
            "DPRC_INFERENCE_TOKEN": token,
            "DPRC_INFERENCE_PARENT_PID": str(os.getpid()),  # it exits when the API is gone
            "HF_HUB_OFFLINE": "1",
        }
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        address = EngineAddress(f"http://127.0.0.1:{port}", token)
        deadline = time.monotonic() + s.inference_start_seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineUnavailable(
                    f"the generation engine exited at start (status {self._proc.returncode}); "
                    "see the server's log"
                )
            try:
                if httpx.get(f"{address.url}/health", timeout=2).status_code == 200:
                    self._address = address
                    log.info(
                        "the generation engine answers at %s (pid %d)", address.url, self._proc.pid
                    )
                    return address
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self._stop_locked()
        raise EngineUnavailable(
            f"the generation engine did not answer within {s.inference_start_seconds:g} s"
        )

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        proc, self._proc, self._address = self._proc, None, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
