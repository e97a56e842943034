"""A big upload's example hashes recorded in short transactions (issue 45;
:mod:`service.data.hash_recordings`), on PostgreSQL and SQLite, with small N (the thresholds
lowered): the same hashes and the same budget group as the one-transaction recording (a
normalised re-upload joins it, through either path, and a superset adds only its new
examples); another upload of the tenant waits for the recording's lease; and a completion
killed with SIGKILL between two batches leaves no file, and the minute sweep rolls it back
(hashes, the group it made, the content) so that a retry of the completion stores it whole."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from service.base.settings import Settings
from service.data import files, hash_recordings, uploads
from service.data.budget_groups import BudgetWish
from service.data.example_hashes import hash_examples, tenant_secret
from service.governance.caller import Caller
from service.governance.keys import authenticate, create_key
from service.store.store import Store, open_store
from service.store.tables import BudgetGroup, ExampleHash, File, HashRecording, Upload
from tests.api.conftest import _settings, jsonl

ROOT = Path(__file__).resolve().parents[2]
BATCH = 7  # rows a recording transaction inserts here


@dataclass
class Env:
    store: Store
    settings: Settings
    url: str | None
    owner: Caller
    secret: str  # the owner's key


@pytest.fixture(params=["postgresql", "sqlite"])
def env(request, tmp_path, monkeypatch) -> Iterator[Env]:
    monkeypatch.setattr(hash_recordings, "BATCHED_MIN", 10)
    monkeypatch.setattr(hash_recordings, "BATCH_ROWS", BATCH)
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    if url is not None:  # a database of its own: the session's is shared by other tests
        from tests.api.conftest import fresh_pg_database

        with fresh_pg_database("dprc_rec") as fresh:
            yield from _env(tmp_path, fresh)
    else:
        yield from _env(tmp_path, None)


def _env(tmp_path: Path, url: str | None) -> Iterator[Env]:
    settings = _settings(tmp_path / "data", url, default_epsilon_budget=8.0)
    store = open_store(settings)
    with store.sessions() as session:
        _id, secret = create_key(session, f"acme-{os.getpid()}", "admin")
    with store.sessions() as session:
        owner = authenticate(session, f"Bearer {secret}")
    try:
        yield Env(store, settings, url, owner, secret)
    finally:
        store.engine.dispose()


def lines(n: int, start: int = 0, shout: bool = False) -> bytes:
    """``n`` labelled lines; ``shout``: the same texts upper-cased with doubled spaces (the
    same canonical keys)."""
    rows = []
    for i in range(start, start + n):
        text = f"review {i} was {'good' if i % 2 else 'bad'}"
        rows.append({"text": text.upper().replace(" ", "  ") if shout else text, "label": i % 2})
    return jsonl(rows)


def _upload(env: Env, data: bytes) -> tuple[str, list[str]]:
    up = uploads.create(
        env.store,
        env.owner,
        size=len(data),
        filename="big.jsonl",
        purpose="fine-tune",
        mime_type="text/jsonl",
        wish=BudgetWish(),
    )
    half = len(data) // 2
    parts = [
        uploads.add_part(env.store, env.owner, up.row.id, io.BytesIO(chunk)).id
        for chunk in (data[:half], data[half:])
    ]
    return up.row.id, parts


def _hashes(env: Env) -> dict[str, str]:
    with env.store.sessions() as session:
        return dict(
            session.execute(
                select(ExampleHash.digest, ExampleHash.group_id).where(
                    ExampleHash.tenant_id == env.owner.tenant_id
                )
            ).all()
        )


def _expected(env: Env, data: bytes) -> set[str]:
    secret = tenant_secret(env.settings.data_dir, env.owner.tenant_id)
    return set(hash_examples(data, secret).digests)


def test_batched_recording_keeps_the_hashes_and_the_group(env):
    data = lines(40)
    upload_id, parts = _upload(env, data)
    done = uploads.complete(env.store, env.owner, upload_id, parts, None)
    assert done.file is not None and done.file.group_id is not None
    group = done.file.group_id
    held = _hashes(env)
    assert set(held) == _expected(env, data) and set(held.values()) == {group}
    assert done.file.budget is not None and done.file.budget.epsilon == 8.0
    with env.store.sessions() as session:
        assert session.scalar(select(func.count()).select_from(HashRecording)) == 0
        g = session.scalar(select(BudgetGroup).where(BudgetGroup.id == group))
        assert g is not None and g.n_examples == 40
    # the same examples after normalisation, one-shot (one transaction): the same group
    again = files.create_file(
        env.store, env.owner, lines(40, shout=True), "x", "fine-tune", BudgetWish()
    )
    assert again.group_id == group and again.joined
    # a superset through the batched path joins it and adds its new examples only
    bigger = lines(60)
    upload_id, parts = _upload(env, bigger)
    more = uploads.complete(env.store, env.owner, upload_id, parts, None)
    assert more.file is not None and more.file.group_id == group and more.file.joined
    held = _hashes(env)
    assert set(held) == _expected(env, bigger) and set(held.values()) == {group}
    with env.store.sessions() as session:
        g = session.scalar(select(BudgetGroup).where(BudgetGroup.id == group))
        assert g is not None and g.n_examples == 60
    # a data set asking for another budget is refused and records nothing
    other = lines(40, start=30)
    up = uploads.create(
        env.store,
        env.owner,
        size=len(other),
        filename="x.jsonl",
        purpose="fine-tune",
        mime_type="text/jsonl",
        wish=BudgetWish(epsilon_budget=2.0),
    )
    part = uploads.add_part(env.store, env.owner, up.row.id, io.BytesIO(other)).id
    with pytest.raises(files.Conflict):
        uploads.complete(env.store, env.owner, up.row.id, [part], None)
    assert set(_hashes(env)) == _expected(env, bigger)
    with env.store.sessions() as session:
        assert session.scalar(select(func.count()).select_from(HashRecording)) == 0
        row = session.scalar(select(Upload).where(Upload.id == up.row.id))
        assert row is not None and row.status == "pending" and row.completing_at is None


def test_an_upload_waits_for_the_tenants_recording(env, monkeypatch):
    with env.store.sessions() as session:  # a live recording's lease
        hash_recordings.acquire(session, env.owner.tenant_id, "file-x", None)
        session.commit()
    monkeypatch.setattr(hash_recordings, "WAIT_SECONDS", 0.5)
    with pytest.raises(hash_recordings.RecordingBusy):
        files.create_file(env.store, env.owner, lines(20), "x", "fine-tune", BudgetWish())
    assert _hashes(env) == {}
    with env.store.sessions() as session:
        assert session.scalar(select(func.count()).select_from(File)) == 0


def test_a_writer_that_fails_stops_the_others_and_the_recording_is_rolled_back(env, monkeypatch):
    """On PostgreSQL the batches are written by ``WRITERS`` connections at once: when one
    fails, the others stop, and the rollback runs once they have all ended — no hash of the
    upload remains, however late the other writer's batch was."""
    data = lines(60)
    upload_id, parts = _upload(env, data)
    real, threads, calls = files.insert_digests, set(), []

    def insert_then_fail(*a, **k):
        threads.add(threading.get_ident())
        calls.append(1)
        if len(calls) == 4:
            raise OSError("the disk is full")
        return real(*a, **k)

    monkeypatch.setattr(files, "insert_digests", insert_then_fail)
    with pytest.raises(OSError, match="the disk is full"):
        uploads.complete(env.store, env.owner, upload_id, parts, None)
    assert len(threads) == (1 if env.url is None else hash_recordings.WRITERS)
    assert len(calls) < 60 // BATCH  # the writers stopped: not every batch was tried
    assert _hashes(env) == {}
    with env.store.sessions() as session:
        assert session.scalar(select(func.count()).select_from(HashRecording)) == 0
        assert session.scalar(select(func.count()).select_from(BudgetGroup)) == 0
        row = session.scalar(select(Upload).where(Upload.id == upload_id))
        assert row is not None and row.status == "pending"
    monkeypatch.setattr(files, "insert_digests", real)  # then a retry stores it whole
    done = uploads.complete(env.store, env.owner, upload_id, parts, None)
    assert done.file is not None and set(_hashes(env)) == _expected(env, data)


KILLER = textwrap.dedent(
    """
    import json, os, signal, sys
    from service.base.settings import Settings
    from service.data import files, hash_recordings, uploads
    from service.governance.keys import authenticate
    from service.store.store import open_store

    args = json.loads(sys.argv[1])
    hash_recordings.BATCHED_MIN, hash_recordings.BATCH_ROWS = 10, args["batch"]
    store = open_store(Settings(**args["settings"]))
    with store.sessions() as session:
        caller = authenticate(session, "Bearer " + args["key"])
    insert, calls = files.insert_digests, []

    def insert_then_die(*a, **k):  # the third batch: two are committed
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return insert(*a, **k)

    files.insert_digests = insert_then_die
    uploads.complete(store, caller, args["upload"], args["parts"], None)
    """
)


def test_a_completion_killed_mid_recording_is_rolled_back_and_retried(env, monkeypatch):
    data = lines(40)
    upload_id, parts = _upload(env, data)
    settings = {
        "data_dir": str(env.settings.data_dir),
        "database_url": env.url,
        "embedded_worker": False,
        "require_budget": False,
        "default_epsilon_budget": 8.0,
    }
    args = {
        "settings": settings,
        "key": env.secret,
        "upload": upload_id,
        "parts": parts,
        "batch": BATCH,
    }
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env_vars["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, json.dumps(args)],
        cwd=ROOT,
        env=env_vars,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    # killed between batches: the batches committed before, its group, its lease; no file
    held = _hashes(env)
    if env.url is None:  # one writer: the two batches before the third
        assert len(held) == 2 * BATCH
    else:  # two writers: the first batch of the one that came back for a second, at least
        assert BATCH <= len(held) <= 2 * BATCH
    assert set(held) <= _expected(env, data)
    with env.store.sessions() as session:
        lease = session.get(HashRecording, env.owner.tenant_id)
        assert lease is not None and lease.upload_id == upload_id and lease.new_group
        assert session.scalar(select(func.count()).select_from(File)) == 0
        content = env.settings.files_dir / str(env.owner.tenant_id) / f"{lease.file_id}.jsonl"
        assert content.exists()
    # the sweep takes it for dead once it stops beating, and rolls it back
    assert hash_recordings.sweep_stale(env.store) == 0  # still fresh
    monkeypatch.setattr(hash_recordings, "STALE_SECONDS", 0)
    uploads.sweep_expired(env.store)
    assert _hashes(env) == {}
    assert not content.exists()
    with env.store.sessions() as session:
        assert session.scalar(select(func.count()).select_from(HashRecording)) == 0
        assert session.scalar(select(func.count()).select_from(BudgetGroup)) == 0
        row = session.scalar(select(Upload).where(Upload.id == upload_id))
        assert row is not None and row.status == "pending" and row.completing_at is None
    # a retry of the completion stores it whole, once
    done = uploads.complete(env.store, env.owner, upload_id, parts, None)
    assert done.file is not None and done.file.row.n_examples == 40
    held = _hashes(env)
    assert set(held) == _expected(env, data) and set(held.values()) == {done.file.group_id}
    with env.store.sessions() as session:
        assert session.scalar(select(func.count()).select_from(File)) == 1
