"""API fixtures: a real PostgreSQL database (created per session, dropped after) and SQLite,
uvicorn serving the app on a free 127.0.0.1 port in a thread, tenants with keys."""

from __future__ import annotations

import io
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest
import uvicorn

from benchmarks.kit.server import exact_job_body, exact_job_event  # noqa: F401 (tests')
from dprc.app import build_app
from service.base.settings import Settings
from service.governance.keys import create_key
from service.store.store import Store

PG_ADMIN = os.environ.get("DPRC_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_admin_conn() -> psycopg.Connection:
    try:
        return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:  # fail, never skip: the suite needs PostgreSQL
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN} (run scripts/services.sh): {exc}")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    name = f"dprc_test_{uuid.uuid4().hex[:12]}"
    with _pg_admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with _pg_admin_conn() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@contextmanager
def fresh_pg_database(prefix: str = "dprc_fresh") -> Iterator[str]:
    """A PostgreSQL database of its own (for a test that replaces a whole database, as a
    restore does), dropped at the end; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _pg_admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    finally:
        with _pg_admin_conn() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@dataclass
class Server:
    base_url: str
    store: Store
    settings: Settings
    app: Any = None  # the FastAPI app (its state: the relay and its engine)

    def key(self, tenant: str, role: str = "admin") -> str:
        """A new key of ``role`` for ``tenant`` (admin by default: it may do everything)."""
        with self.store.sessions() as session:
            return create_key(session, tenant, role)[1]

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=key, max_retries=0, timeout=120
        )

    def http(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(settings: Settings, **options: object) -> Iterator[Server]:
    """The app over uvicorn as ``dprc serve`` runs it (uvicorn's proxy headers off: the app
    believes only ``settings.trusted_proxies``); ``options`` go to uvicorn (``ssl_certfile``
    and ``ssl_keyfile``: https)."""
    app = build_app(settings)
    port = _free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        proxy_headers=False,
        **options,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        scheme = "https" if "ssl_certfile" in options else "http"
        yield Server(f"{scheme}://127.0.0.1:{port}", app.state.store, settings, app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def serving(settings: Settings) -> AbstractContextManager[Server]:
    """:func:`_serve` as a context manager: a server that a test stops and starts again (on
    the same data folder and database)."""
    return contextmanager(_serve)(settings)


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``dprc ARGV`` in this process: (exit status, stdout, stderr). Not with ``capsys``,
    whose stream a uvicorn server started in the test would keep writing to."""
    from dprc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def _settings(tmp: Path, database_url: str | None, **kw: object) -> Settings:
    kw.setdefault("embedded_worker", False)  # API tests: jobs stay queued (no worker)
    # tests that are not about budget policy may upload unbudgeted data sets; the default
    # policy (a budget required) is tested in tests/api/test_budget_governance.py
    kw.setdefault("require_budget", False)
    return Settings(
        data_dir=tmp,
        database_url=database_url,
        max_upload_bytes=64 * 1024,
        max_active_jobs_per_tenant=40,
        **kw,
    )  # type: ignore[arg-type]


@pytest.fixture(scope="session", params=["postgresql", "sqlite"])
def server(request, pg_url, tmp_path_factory) -> Iterator[Server]:
    """The API over uvicorn, on PostgreSQL and on SQLite."""
    tmp = tmp_path_factory.mktemp(f"dprc-{request.param}")
    url = pg_url if request.param == "postgresql" else None
    yield from _serve(_settings(tmp, url))


@pytest.fixture(scope="session")
def pg_server(pg_url, tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-pg-only"), pg_url))


@pytest.fixture(scope="session")
def sqlite_server(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-sqlite-only"), None))


def jsonl(lines: list[dict]) -> bytes:
    import json

    return ("\n".join(json.dumps(x) for x in lines) + "\n").encode()


def text_lines(n: int) -> bytes:
    return jsonl([{"text": f"example number {i}: the quick brown fox"} for i in range(n)])


def labelled_lines(n: int) -> bytes:
    return jsonl(
        [{"text": f"review {i} was {'good' if i % 2 else 'bad'}", "label": i % 2} for i in range(n)]
    )
