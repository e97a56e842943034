"""Backups of the privacy record (issue 30, part 5), through uvicorn on SQLite and on a
PostgreSQL database of the test's own: ``dprc admin backup`` while the server runs; the acts
after it (an upload, a budget change, a job) are gone after ``dprc admin restore`` and the
backed-up ones are all there, the audit chain whole; ``dprc admin check`` passes. A tampered
backup (a file, the manifest, an extra or a missing file, a newer migration, another database
kind) is refused naming what is wrong, and changes nothing. A restore onto a data volume that
is not the backed-up one freezes every data set (job creation 409 ``budget_group_frozen``)
until an admin acknowledges it; the tenants' keys come back with the backup, so a re-upload
of the same data still joins its data set."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from service.base.settings import Settings
from tests.api.conftest import (
    _settings,
    exact_job_body,
    fresh_pg_database,
    labelled_lines,
    run_cli,
    serving,
)

JOBS = "/v1/fine_tuning/jobs"


def _head() -> str:
    """This release's migration head."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from service.store.db import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path, monkeypatch) -> Iterator[Settings]:
    """The server's settings, and the same store for the ``dprc admin`` commands (their
    environment): a SQLite file in the data folder, or a fresh PostgreSQL database."""
    data = tmp_path / "data"
    monkeypatch.setenv("DPRC_DATA_DIR", str(data))
    if request.param == "sqlite":
        monkeypatch.delenv("DPRC_DATABASE_URL", raising=False)
        yield _settings(data, None, require_budget=True)
        return
    with fresh_pg_database("dprc_backup") as url:
        monkeypatch.setenv("DPRC_DATABASE_URL", url)
        yield _settings(data, url, require_budget=True)


def _upload(client: openai.OpenAI, data: bytes, epsilon: float | None = 8.0):
    extra = {"epsilon_budget": epsilon} if epsilon is not None else {}
    return client.files.create(file=("d.jsonl", data), purpose="fine-tune", extra_body=extra)


def _create(http, file_id: str):
    return http.post(JOBS, json=exact_job_body(file_id, 1.0))


def _audit(http) -> list[dict]:
    r = http.get("/v1/organization/audit_logs", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_backup_while_serving_and_restore_round_trip(backend, tmp_path, monkeypatch):
    backup = tmp_path / "backup"
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    with serving(backend) as srv:
        key = srv.key(tenant)
        client = srv.client(key)
        kept = _upload(client, labelled_lines(60))
        with srv.http(key) as http:
            job = _create(http, kept.id)
            assert job.status_code == 200, job.text
            audit_before = _audit(http)
        # online: the server is up and answering while the backup is taken
        status, said, err = run_cli("admin", "backup", str(backup))
        assert status == 0, err
        kind = "sqlite" if backend.database_url is None else "postgresql"
        assert f"{kind} database at migration {_head()} (1 jobs, 1 data sets)" in said
        manifest = json.loads((backup / "manifest.json").read_text())
        assert manifest["database"]["kind"] == kind
        assert set(manifest["jobs"]) == {job.json()["id"]}
        assert any(name.startswith("secrets/tenant-") for name in manifest["files"])
        for name, entry in manifest["files"].items():  # a SHA-256 of every file
            assert hashlib.sha256((backup / name).read_bytes()).hexdigest() == entry["sha256"]
        assert (backup.stat().st_mode & 0o777) == 0o700
        # after the backup: another data set, a budget change and another job
        later = _upload(client, labelled_lines(60).replace(b"review", b"critique"))
        with srv.http(key) as http:
            r = http.post(f"/v1/files/{kept.id}/budget", json={"epsilon_budget": 9, "reason": "x"})
            assert r.status_code == 200, r.text
            assert _create(http, later.id).status_code == 200
            assert len(_audit(http)) > len(audit_before)

    # a backup folder is never overwritten
    status, _, err = run_cli("admin", "backup", str(backup))
    assert status == 2 and "is not an empty folder" in err
    status, said, err = run_cli("admin", "restore", str(backup), "--yes")
    assert status == 0, err
    assert said.startswith(f"restored the {kind} backup of {manifest['created_at_utc']}")
    assert "frozen" not in said  # no job ran after the backup (no worker): nothing to freeze

    with serving(backend) as srv:
        client = srv.client(key)
        assert client.files.retrieve(kept.id).model_extra["budget"]["epsilon"] == 8.0
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(later.id)
        with srv.http(key) as http:
            jobs = http.get(JOBS).json()["data"]
            assert [j["id"] for j in jobs] == [job.json()["id"]]
            assert _audit(http) == audit_before  # the chain as it was, whole
            again = _create(http, kept.id)  # not frozen: nothing ran after the backup
            assert again.status_code == 200, again.text
        monkeypatch.setenv("DPRC_SERVER_URL", srv.base_url)
        monkeypatch.setenv("DPRC_API_KEY", key)
        monkeypatch.setenv("DPRC_CLIENT_CONFIG", str(tmp_path / "absent.toml"))
        status, said, err = run_cli("audit", "verify")
        assert status == 0 and said.startswith("ok: "), err
    status, said, err = run_cli("admin", "check")
    assert status == 0, said + err
    assert said.startswith("ok: 2 jobs, 0 ledger files, 1 data sets (0 frozen)")


def _rewrite_manifest(folder: Path, change) -> None:
    """Edit the manifest and recompute its digest (a forger who knows the format)."""
    body = json.loads((folder / "manifest.json").read_text())
    body.pop("digest")
    change(body)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    body["digest"] = hashlib.sha256(canonical.encode()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(body))


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_a_tampered_backup_is_refused_and_changes_nothing(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("DPRC_DATA_DIR", str(data))
    monkeypatch.delenv("DPRC_DATABASE_URL", raising=False)
    settings = _settings(data, None, require_budget=True)
    with serving(settings) as srv:
        key = srv.key("tamper")
        _upload(srv.client(key), labelled_lines(30))
    backup = tmp_path / "backup"
    assert run_cli("admin", "backup", str(backup))[0] == 0
    before = _tree(data)

    def refused(edit, expected: str) -> None:
        case = tmp_path / f"case-{uuid.uuid4().hex[:6]}"
        shutil.copytree(backup, case)
        edit(case)
        status, _, err = run_cli("admin", "restore", str(case), "--yes")
        assert status == 2 and err.startswith("dprc: error: ") and expected in err, err
        assert _tree(data) == before  # nothing changed, nothing left behind

    key_file = next(
        n
        for n in json.loads((backup / "manifest.json").read_text())["files"]
        if n.startswith("secrets/")
    )

    def flip(case: Path) -> None:
        path = case / key_file
        path.write_bytes(path.read_bytes()[:-2] + b"00")

    refused(flip, f"{key_file}: checksum mismatch")

    def earlier(case: Path) -> None:  # an edit that leaves the digest as it was
        body = json.loads((case / "manifest.json").read_text())
        body["created_at"] -= 3600
        (case / "manifest.json").write_text(json.dumps(body))

    refused(earlier, "manifest.json was changed after the backup")
    refused(
        lambda c: (c / "ledgers" / "extra.json").write_text("{}"),
        "ledgers/extra.json: in the backup folder but not in manifest.json",
    )
    refused(
        lambda c: (c / "database" / "dprc.sqlite3").unlink(),
        "database/dprc.sqlite3: listed in manifest.json but missing",
    )
    refused(
        lambda c: _rewrite_manifest(c, lambda b: b["database"].update(alembic_revision="0099")),
        f"at migration '0099', which this release (head {_head()}) does not know",
    )
    refused(
        lambda c: _rewrite_manifest(c, lambda b: b["database"].update(kind="postgresql")),
        "the backup is of a postgresql database, the configured one is sqlite",
    )
    refused(lambda c: (c / "manifest.json").unlink(), "holds no manifest.json: not a dprc backup")
    # without --yes and without a terminal: refused before reading anything
    status, _, err = run_cli("admin", "restore", str(backup))
    assert status == 2 and "pass --yes" in err


def test_a_lost_data_volume_freezes_every_data_set(tmp_path, monkeypatch):
    """The data volume lost with the database: the backup alone cannot tell which data sets
    jobs spent on after it, so a restore freezes them all; the tenants' keys come back, so
    the same data re-uploaded still joins its data set (and its freeze)."""
    old = tmp_path / "old"
    monkeypatch.setenv("DPRC_DATA_DIR", str(old))
    monkeypatch.delenv("DPRC_DATABASE_URL", raising=False)
    data = labelled_lines(50)
    with serving(_settings(old, None, require_budget=True)) as srv:
        admin = srv.key("lost")
        trainer = srv.key("lost", "trainer")
        f = _upload(srv.client(admin), data)
        group = f.model_extra["budget_group"]
    backup = tmp_path / "backup"
    assert run_cli("admin", "backup", str(backup))[0] == 0

    new = tmp_path / "new"  # a new, empty data volume (and with it the SQLite file)
    monkeypatch.setenv("DPRC_DATA_DIR", str(new))
    status, said, err = run_cli("admin", "restore", str(backup), "--yes")
    assert status == 0, err
    assert "the data volume is not the one the backup was taken from" in said
    assert f"frozen: {group}: " in said
    with serving(_settings(new, None, require_budget=True)) as srv:
        again = _upload(srv.client(admin), data, epsilon=None)  # the restored key hashes it
        assert again.model_extra["joined_budget_group"] is True
        assert again.model_extra["budget_group"] == group
        with srv.http(trainer) as http:
            r = _create(http, again.id)
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert error["code"] == "budget_group_frozen" and error["param"] == "training_file"
            assert "not the backed-up one" in error["message"]
            assert f"dprc admin acknowledge {group}" in error["message"]
            ack = http.post(
                f"/v1/organization/budget_groups/{group}/acknowledge", json={"reason": "x"}
            )
            assert ack.status_code == 403  # a trainer may not
        with srv.http(admin) as http:
            url = f"/v1/organization/budget_groups/{group}/acknowledge"
            assert http.post(url, json={}).status_code == 400  # a reason is required
            assert (
                http.post(url, json={"reason": "x", "epsilon": 1}).json()["error"]["code"]
                == "unknown_field"
            )
            assert (
                http.post(
                    "/v1/organization/budget_groups/bg-none/acknowledge", json={"reason": "x"}
                ).status_code
                == 404
            )
            ack = http.post(
                url,
                json={"reason": "nothing ran after the backup: the old volume's ledgers say so"},
            )
            assert ack.status_code == 200, ack.text
            assert ack.json()["frozen"] is False and ack.json()["frozen_reason"] is None
            again_ack = http.post(url, json={"reason": "twice"})
            assert again_ack.status_code == 409
            assert again_ack.json()["error"]["code"] == "budget_group_not_frozen"
            assert _create(http, f.id).status_code == 200
            entries = _audit(http)
        freeze = [e for e in entries if e["action"] == "budget.freeze"]
        assert [(e["resource"], e["role"], e["key_id"]) for e in freeze] == [(group, "shell", None)]
        (ack_entry,) = [e for e in entries if e["action"] == "budget.acknowledge"]
        assert ack_entry["resource"] == group and ack_entry["role"] == "admin"
        assert ack_entry["detail"]["frozen_reason"] == freeze[0]["detail"]["reason"]


def test_a_postgresql_restore_that_fails_changes_nothing(tmp_path, monkeypatch):
    """The dump and the freezes run in one transaction: a restore that cannot finish (here a
    server's open transaction holds a table past the lock timeout) leaves the database and the
    data volume as they were."""
    import psycopg

    from service.admin import database_copy

    data = tmp_path / "data"
    monkeypatch.setenv("DPRC_DATA_DIR", str(data))
    monkeypatch.setattr(database_copy, "PG_LOCK_TIMEOUT", "1s")
    with fresh_pg_database("dprc_atomic") as url:
        monkeypatch.setenv("DPRC_DATABASE_URL", url)
        settings = _settings(data, url, require_budget=True)
        with serving(settings) as srv:
            key = srv.key("atomic")
            _upload(srv.client(key), labelled_lines(30))
            assert run_cli("admin", "backup", str(tmp_path / "backup"))[0] == 0
            later = _upload(srv.client(key), labelled_lines(30).replace(b"review", b"note"))
        volume = _tree(data)
        with psycopg.connect(url) as holder:  # a transaction still open on the table
            holder.execute("SELECT count(*) FROM files")
            status, _, err = run_cli("admin", "restore", str(tmp_path / "backup"), "--yes")
            assert status == 2 and "psql failed" in err and "lock timeout" in err, err
        assert _tree(data) == volume
        with serving(settings) as srv:
            assert srv.client(key).files.retrieve(later.id).id == later.id  # still there


def test_an_older_backup_is_restored_and_migrated(backend, tmp_path, monkeypatch):
    """A backup of a database at an earlier migration (0005, before freezes existed): the
    restore loads it, migrates it to this release's head and then freezes (here every data set:
    the data volume is a new one)."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from service.admin.backup import backup
    from service.store.db import MIGRATIONS, make_engine, make_sessionmaker
    from service.store.store import Store

    old = backend.model_copy(update={"data_dir": tmp_path / "old"})
    engine = make_engine(old)
    try:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0005")
            conn.execute(text("INSERT INTO tenants (name, created_at) VALUES ('old', 1)"))
            conn.execute(
                text(
                    "INSERT INTO budget_groups (id, tenant_id, created_at, n_examples, "
                    "epsilon_budget, delta, epsilon_spent, epsilon_committed) "
                    "SELECT 'bg-old', id, 1, 100, 4.0, 0.0001, 0, 0 FROM tenants"
                )
            )
        store = Store(settings=old, engine=engine, sessions=make_sessionmaker(engine))
        manifest = backup(store, tmp_path / "backup")  # the service's backup, on a 0005 store
    finally:
        engine.dispose()
    assert manifest.alembic_revision == "0005" and set(manifest.groups) == {"bg-old"}

    status, said, err = run_cli("admin", "restore", str(tmp_path / "backup"), "--yes")
    assert status == 0, err
    assert "migrated the database from 0005 to this release's head" in said
    assert "frozen: bg-old: " in said
    engine = make_engine(backend)
    try:
        with engine.connect() as conn:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            reason = conn.execute(text("SELECT frozen_reason FROM budget_groups")).scalar()
            actions = conn.execute(text("SELECT action, role FROM audit_log")).all()
    finally:
        engine.dispose()
    assert revision == _head()
    assert "not the backed-up one" in reason
    assert [tuple(a) for a in actions] == [("budget.freeze", "shell")]
