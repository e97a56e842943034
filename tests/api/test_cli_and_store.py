"""``dprc keys`` / ``dprc serve`` and the store: migrations applied at start-up match the
tables on PostgreSQL and SQLite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from dprc.cli import main
from service.base.settings import Settings
from service.store.db import make_engine, upgrade
from service.store.tables import Base
from tests.api.conftest import _free_port


def test_keys_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DPRC_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DPRC_DATABASE_URL", raising=False)
    assert main(["keys", "create", "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("dprc-")  # only the key on stdout
    key = out.strip()
    assert main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    key_id = listing.split("\t")[0]
    assert "acme" in listing and "active" in listing and key not in listing
    assert main(["keys", "revoke", key_id]) == 0
    assert main(["keys", "list"]) == 0
    assert "revoked" in capsys.readouterr().out
    assert main(["keys", "list", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["id"] == key_id and row["tenant"] == "acme" and row["revoked_at"] is not None
    assert main(["keys", "revoke", "key-missing"]) == 2


def test_serve_subprocess(tmp_path):
    """``dprc serve`` over the console script, with a key from ``dprc keys create``."""
    env = {**os.environ, "DPRC_DATA_DIR": str(tmp_path)}
    env.pop("DPRC_DATABASE_URL", None)
    dprc = [sys.executable, "-m", "dprc.cli"]
    key = subprocess.run(
        [*dprc, "keys", "create", "--tenant", "t"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    port = _free_port()
    proc = subprocess.Popen(
        [*dprc, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(
                    f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}
                )
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["object"] == "list"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_migrations_match_tables(backend, pg_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=pg_url if backend == "postgresql" else None)
    engine = make_engine(settings)
    upgrade(engine)
    upgrade(engine)  # idempotent at start-up
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []
