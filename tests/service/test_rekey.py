"""Migration 0010 and the start-up re-key (service/data/rekey.py): a store written before the
canonical key, with example hashes over the raw text (computed here with hmac, as the code of
that time did), opens with its groups carried forward — a copy the model cannot tell apart
from a file whose content remains joins its group, an exact copy of a deleted file's data
still finds its group by the raw-text hash, and no group's N grows — on SQLite and
PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from service.base.settings import Settings
from service.data import files
from service.data.budget_groups import BudgetWish
from service.data.rekey import open_current_store
from service.governance.caller import Caller
from service.store.db import MIGRATIONS, make_engine
from service.store.tables import BudgetGroup, ExampleHash, LegacyExampleHash, Tenant
from tests.api.conftest import PG_ADMIN, _pg_admin_conn

SECRET = bytes(range(32))


def _rows(tag: str, n: int) -> list[dict]:
    return [{"text": f"Visit {tag} {i}: the Patient is well"} for i in range(n)]


def _jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def _raw_digest(text: str) -> str:
    return hmac.new(SECRET, text.encode(), hashlib.sha256).hexdigest()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    if request.param == "sqlite":
        yield None
        return
    name = f"dprc_rekey_{uuid.uuid4().hex[:12]}"
    with _pg_admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    with _pg_admin_conn() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _store_at_0009(settings: Settings, kept: list[dict], deleted: list[dict]) -> None:
    """A store as 0009's code left it: one tenant, a group with a file on disk and a deleted
    file, their raw-text hashes."""
    engine = make_engine(settings)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0009")
    (settings.data_dir / "secrets").mkdir(parents=True)
    (settings.data_dir / "secrets" / "tenant-1.key").write_text(SECRET.hex())
    folder = settings.data_dir / "files" / "tenant-1"
    folder.mkdir(parents=True)
    (folder / "file-kept.jsonl").write_bytes(_jsonl(kept))
    n = len(kept) + len(deleted)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO tenants (id, name, created_at) VALUES (1, 'old', 1)"))
        conn.execute(
            sa.text(
                "INSERT INTO budget_groups (id, tenant_id, created_at, n_examples, "
                "epsilon_budget, delta, epsilon_spent, epsilon_committed, privacy_unit) VALUES "
                "('bg-old', 1, 1, :n, 3.0, 0.001, 0, 0, 'example')"
            ),
            {"n": n},
        )
        made = [("file-kept", kept, False)] + ([("file-gone", deleted, True)] if deleted else [])
        for fid, rows, gone in made:
            conn.execute(
                sa.text(
                    "INSERT INTO files (id, tenant_id, filename, purpose, bytes, created_at, "
                    "storage_path, n_examples, data_format, group_id, unbudgeted, deleted) "
                    "VALUES (:id, 1, 'd.jsonl', 'fine-tune', 1, 1, :path, :n, 'text', 'bg-old', "
                    "false, :gone)"
                ),
                {"id": fid, "path": str(folder / f"{fid}.jsonl"), "n": len(rows), "gone": gone},
            )
            for r in rows:
                conn.execute(
                    sa.text(
                        "INSERT INTO example_hashes (tenant_id, digest, group_id) "
                        "VALUES (1, :d, 'bg-old')"
                    ),
                    {"d": _raw_digest(r["text"])},
                )
    engine.dispose()


def test_a_store_from_before_the_canonical_key_is_carried_forward(database, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=database, require_budget=True)
    kept, deleted = _rows("kept", 30), _rows("gone", 20)
    _store_at_0009(settings, kept, deleted)
    store = open_current_store(settings)  # migrations to head, then the re-key
    try:
        with store.sessions() as session:
            tenant = session.get(Tenant, 1)
            assert tenant is not None and tenant.hash_version == 2 and tenant.legacy_hashes
            group = session.scalar(sa.select(BudgetGroup))
            assert group is not None and group.n_examples == 50  # N kept
            canonical = session.scalar(sa.select(sa.func.count()).select_from(ExampleHash))
            legacy = session.scalar(sa.select(sa.func.count()).select_from(LegacyExampleHash))
        assert canonical == 30 and legacy == 50  # raw rows kept for lookups only
        owner = Caller(tenant_id=1, tenant_name="old", key_id="key-owner", role="admin")

        def upload(rows: list[dict], **wish: float) -> files.DataSet:
            return files.create_file(
                store, owner, _jsonl(rows), "d.jsonl", "fine-tune", BudgetWish(**wish)
            )

        # a lower-cased copy of the file on disk joins its group
        lowered = upload([{"text": r["text"].lower() + "  "} for r in kept])
        assert lowered.group_id == "bg-old" and lowered.joined
        # an edited copy of the deleted file's data cannot be caught: only its raw-text hashes
        # remain, and the edit changed them (docs/governance.md)
        edited = upload([{"text": r["text"].upper()} for r in deleted[:5]], epsilon_budget=1.0)
        assert edited.group_id != "bg-old" and not edited.joined
        # its exact data (the rest of it: the first lines now also belong to the edited copy's
        # new group, and budgets are never merged) still finds its group by the raw-text hash,
        # and brings its canonical keys back to the group: from then on its edited copies join
        again = upload(deleted[5:])
        assert again.group_id == "bg-old" and again.joined
        late = upload([{"text": r["text"].upper()} for r in deleted[5:]])
        assert late.group_id == "bg-old" and late.joined
        # opening the store again re-keys nothing twice
        from service.data.rekey import rekey_store

        assert rekey_store(store) == 0
    finally:
        store.engine.dispose()


def test_a_tenant_whose_files_all_remain_keeps_no_raw_hashes(tmp_path):
    settings = Settings(data_dir=tmp_path, require_budget=True)
    _store_at_0009(settings, _rows("kept", 10), [])
    store = open_current_store(settings)
    try:
        with store.sessions() as session:
            tenant = session.get(Tenant, 1)
            assert tenant is not None and tenant.hash_version == 2 and not tenant.legacy_hashes
            assert session.scalar(sa.select(sa.func.count()).select_from(LegacyExampleHash)) == 0
            assert session.scalar(sa.select(sa.func.count()).select_from(ExampleHash)) == 10
    finally:
        store.engine.dispose()
