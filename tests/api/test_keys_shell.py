"""``dprc keys`` on the server's shell: ``--role`` (default trainer, a bad one is exit 2),
``--name``, the role in ``keys list``, and the shell's acts in the tenant's audit log (no key,
role ``shell``), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest

from dprc.cli import main
from service.base.settings import Settings
from service.governance.audit import AuditFilter, list_entries
from service.governance.keys import Caller, get_or_create_tenant
from service.store.store import open_store


@pytest.fixture(params=["sqlite", "postgresql"])
def shell_env(request, tmp_path, monkeypatch, pg_url):
    monkeypatch.setenv("DPRC_DATA_DIR", str(tmp_path))
    if request.param == "postgresql":
        monkeypatch.setenv("DPRC_DATABASE_URL", pg_url)
    else:
        monkeypatch.delenv("DPRC_DATABASE_URL", raising=False)


def _listed(capsys, tenant: str) -> dict[str, dict]:
    assert main(["keys", "list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return {r["id"]: r for r in rows if r["tenant"] == tenant}


def test_keys_create_takes_a_role(shell_env, capsys):
    tenant = f"shell-{uuid.uuid4().hex[:8]}"
    assert main(["keys", "create", "--tenant", tenant, "--role", "viewer", "--name", "ro"]) == 0
    out = capsys.readouterr()
    assert out.out.count("\n") == 1 and out.out.startswith("dprc-")  # only the key on stdout
    assert "viewer key" in out.err
    assert main(["keys", "create", "--tenant", tenant]) == 0
    capsys.readouterr()
    rows = sorted(_listed(capsys, tenant).values(), key=lambda r: r["role"])
    assert [(r["role"], r["name"], r["created_by"]) for r in rows] == [
        ("trainer", None, None),
        ("viewer", "ro", None),
    ]
    assert main(["keys", "list"]) == 0
    table = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    mine = {cells[0]: cells for cells in table if cells[1] == tenant}
    assert {cells[2] for cells in mine.values()} == {"trainer", "viewer"}

    with pytest.raises(SystemExit) as bad_role:
        main(["keys", "create", "--tenant", tenant, "--role", "root"])
    assert bad_role.value.code == 2 and "invalid choice: 'root'" in capsys.readouterr().err
    assert main(["keys", "create", "--tenant", tenant, "--name", ""]) == 2
    assert "name must be 1 to 128" in capsys.readouterr().err
    assert len(_listed(capsys, tenant)) == 2  # neither refusal made a key


def test_shell_acts_are_audited(shell_env, capsys):
    tenant = f"shell-{uuid.uuid4().hex[:8]}"
    assert main(["keys", "create", "--tenant", tenant, "--role", "admin"]) == 0
    capsys.readouterr()
    (admin_id,) = _listed(capsys, tenant)
    assert main(["keys", "create", "--tenant", tenant, "--role", "viewer"]) == 0
    capsys.readouterr()
    (viewer_id,) = set(_listed(capsys, tenant)) - {admin_id}
    assert main(["keys", "revoke", viewer_id]) == 0
    assert main(["keys", "revoke", viewer_id]) == 0  # again: no change, no entry
    assert main(["keys", "revoke", admin_id]) == 0  # the shell may revoke the last admin
    assert main(["keys", "revoke", "key-missing"]) == 2

    store = open_store(Settings())
    try:
        with store.sessions() as session:
            tenant_id = get_or_create_tenant(session, tenant).id
        reader = Caller(tenant_id, tenant, "key-test", "admin")
        entries, _ = list_entries(store, reader, AuditFilter(), None, 100)
    finally:
        store.engine.dispose()
    assert [(e.action, e.resource, e.key_id, e.role) for e in entries] == [
        ("key.create", admin_id, None, "shell"),
        ("key.create", viewer_id, None, "shell"),
        ("key.revoke", viewer_id, None, "shell"),
        ("key.revoke", admin_id, None, "shell"),
    ]
    assert entries[2].detail == {"role": "viewer", "name": None}
    assert all(b.prev_hash == a.hash for a, b in zip(entries, entries[1:], strict=False))
