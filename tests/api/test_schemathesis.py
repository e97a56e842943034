"""A short schemathesis run against /openapi.json with a valid key on PostgreSQL: no 5xx.
(``make schemathesis`` runs a longer one.)"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from tests.api.conftest import PG_ADMIN, _pg_admin_conn

ROOT = Path(__file__).resolve().parents[2]


def test_schemathesis_finds_no_server_error():
    name = f"dprc_st_{uuid.uuid4().hex[:10]}"
    with _pg_admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
        proc = subprocess.run(
            [
                sys.executable,
                "scripts/schemathesis_run.py",
                "--database-url",
                url,
                "--max-examples",
                "8",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        tail = (proc.stdout + proc.stderr)[-4000:]
        if proc.returncode:
            print(proc.stdout, proc.stderr)  # shown by pytest on failure
        assert proc.returncode == 0, tail
        assert "Server error" not in proc.stdout, tail
    finally:
        with _pg_admin_conn() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
