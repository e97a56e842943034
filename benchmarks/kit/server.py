"""The service the server benchmarks measure: a real ``dprc serve`` as a subprocess (SQLite,
in a folder of its own), or the app over uvicorn in this process (SQLite or a fresh
PostgreSQL database), and the job bodies they create. tests/serve_process.py and
tests/api/conftest.py take their helpers of the same names from here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.kit.pages import ROOT
from scripts.shell_keys import shell_key  # the scripts' key helper (scripts/shell_keys.py)

if TYPE_CHECKING:
    from dprc_core.accounting import PrivacyEvent
    from service.base.settings import Settings

DPRC = [sys.executable, "-m", "dprc.cli"]  # how the benchmarks call ``dprc``


def admin_key(env: dict[str, str], tenant: str) -> str:
    """A new admin key of ``tenant``, made by ``dprc keys create`` with the server's ``env``
    (``scripts/shell_keys.py``, the scripts' own helper)."""
    return shell_key(list(DPRC), env, ROOT, tenant, "admin")


PG_ADMIN = os.environ.get("DPRC_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def dprc_serve(
    command: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path | None = None
) -> Iterator[str]:
    """Run ``command serve`` (``command``: how to call ``dprc``) with ``env``, its output in
    ``log_path``; yields its URL once ``/healthz`` answers (a failure to start says why, with
    the log); stops it on exit (SIGTERM, then SIGKILL after a minute)."""
    port = free_port()
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


@dataclass(frozen=True)
class Server:
    """A running ``dprc serve``: its URL, an admin key, its pid and its data folder."""

    url: str
    key: str
    pid: int
    data_dir: Path


@contextmanager
def dprc_server(
    tmp: Path, default_epsilon: float = 8.0, embedded_worker: bool = False
) -> Iterator[Server]:
    """A real ``dprc serve`` on SQLite in ``tmp/data``, embedded worker off unless
    ``embedded_worker`` (created jobs stay queued), with an admin key of a tenant ``bench``
    whose data sets get the budget ``default_epsilon``."""
    data_dir = tmp / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_DATA_DIR=str(data_dir),
        DPRC_DEFAULT_EPSILON_BUDGET=str(default_epsilon),
        DPRC_EMBEDDED_WORKER="true" if embedded_worker else "false",
        DPRC_LOG_LEVEL="warning",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    key = admin_key(env, "bench")
    with dprc_serve(DPRC, env, tmp / "server.log", cwd=ROOT) as url:
        yield Server(url, key, server_pid(int(url.rsplit(":", 1)[1])), data_dir)


def serve_in_thread(settings: Settings) -> tuple[Any, threading.Thread, str, Any]:
    """The app ``dprc serve`` builds, over uvicorn in a thread of this process: the uvicorn
    server (set ``should_exit`` to stop it), its thread, its URL and the app's store."""
    import uvicorn

    from dprc.app import build_app

    app = build_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}", app.state.store


def pg_database(name: str, admin: str = PG_ADMIN) -> str:
    """A fresh PostgreSQL database ``name`` (dropped first if it exists): its SQLAlchemy URL."""
    import psycopg

    with psycopg.connect(admin.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name


def exact_job_body(file_id: str, epsilon: float) -> dict:
    """A create body of a one-epoch MiniLM job with exact clipping (batch 20): cheap to plan,
    so budget tests and benchmarks measure the budget, not the calibration."""
    return {
        "model": "minilm-l6-v2",
        "training_file": file_id,
        "hyperparameters": {"n_epochs": 1, "batch_size": 20},
        "privacy": {"target_epsilon": epsilon, "clipping": {"method": "exact"}},
    }


def exact_job_event(job: dict) -> PrivacyEvent:
    """The privacy event a created exact-clipping job was charged (from its privacy object)."""
    from dprc_core.accounting import PrivacyEvent

    p = job["privacy"]
    return PrivacyEvent(p["noise_multiplier"], p["sample_rate"], p["steps"], "exact", None)
