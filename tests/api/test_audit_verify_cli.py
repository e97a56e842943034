"""``dprc audit list|verify`` run as a subprocess against the server: verify recomputes the
chain on the client and says ok; after one ``UPDATE`` of an entry's detail straight in the
database (SQLite file or PostgreSQL) it exits 1 naming exactly that entry."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid

import psycopg

DPRC = [sys.executable, "-m", "dprc.cli"]
KEYS = "/v1/organization/api_keys"


def _dprc(server, key: str, tmp_path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_SERVER_URL=server.base_url,
        DPRC_API_KEY=key,
        DPRC_CLIENT_CONFIG=str(tmp_path / "absent.toml"),
    )
    return subprocess.run([*DPRC, *argv], env=env, capture_output=True, text=True, timeout=120)


def _tamper(server, entry_id: str, detail: str) -> None:
    """One SQL UPDATE in the database itself, behind the service's back."""
    settings = server.settings
    if settings.database_url:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute("UPDATE audit_log SET detail = %s WHERE id = %s", (detail, entry_id))
    else:
        conn = sqlite3.connect(settings.data_dir / "dprc.sqlite3", timeout=30)
        with conn:
            conn.execute("UPDATE audit_log SET detail = ? WHERE id = ?", (detail, entry_id))
        conn.close()


def test_audit_verify_finds_the_changed_entry(server, tmp_path):
    key = server.key(f"verify-{uuid.uuid4().hex[:10]}")
    with server.http(key) as admin:
        made = [admin.post(KEYS, json={"role": r, "name": r}).json() for r in ("viewer", "trainer")]
        assert admin.delete(f"{KEYS}/{made[0]['id']}").status_code == 200
        entries = admin.get("/v1/organization/audit_logs").json()["data"]
    assert len(entries) == 4

    out = _dprc(server, key, tmp_path, "audit", "verify")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ok: 4 entries, head {entries[-1]['hash']}"

    listed = _dprc(server, key, tmp_path, "audit", "list", "--action", "key.create", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["id"] for e in json.loads(listed.stdout)] == [e["id"] for e in entries[:3]]
    table = _dprc(server, key, tmp_path, "audit", "list", "--resource", made[0]["id"])
    assert table.returncode == 0 and "key.revoke" in table.stdout and "(shell)" not in table.stdout

    # a trainer's key may not read the log: one line, exit 2
    refused = _dprc(server, made[1]["key"], tmp_path, "audit", "verify")
    assert refused.returncode == 2 and "HTTP 403 permission_denied" in refused.stderr

    target = entries[1]  # the viewer's creation: claim it was a trainer
    _tamper(server, target["id"], json.dumps({"name": "viewer", "role": "trainer"}))
    out = _dprc(server, key, tmp_path, "audit", "verify")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stdout.strip() == f"entry {target['id']} (#2): hash mismatch"
