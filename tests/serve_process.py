"""A real ``dprc serve`` as a subprocess on a free port (the client, docs and log tests run
against one): started, waited for until ``/healthz`` answers, and stopped with its process
group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.api.conftest import _free_port


@contextmanager
def dprc_serve(
    command: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path | None = None
) -> Iterator[str]:
    """Run ``command serve`` (``command``: how to call ``dprc``) with ``env``, its output in
    ``log_path``; yields its URL once ``/healthz`` answers (a failure to start says why, with
    the log); stops it on exit (SIGTERM, then SIGKILL after a minute)."""
    port = _free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [*command, "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=5).close()
                break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dprc serve did not start:\n{log_path.read_text()}"
                    ) from exc
                time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def server_pid(port: int) -> int:
    """The pid of the ``dprc serve`` listening on ``port`` (its command line names it)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(port).encode() in argv:
            return int(proc.name)
    raise RuntimeError(f"no dprc serve on port {port}")


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (MiB) of ``pid``."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) / 1024
    return out
