"""The lookup and the record of a job's token-id sequences (service/data/token_hashes.py), without a
model: stores built with MiniLM's (uncased) tokenizer, checked for budget groups of one tenant
on SQLite and PostgreSQL (migrations to head, so 0011 too) — a group's own sequences pass and
add nothing, another group's fail naming it and record nothing, chunks of any size, and two
groups racing on the same new data: exactly one records it."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dprc_core.training import token_store
from service.base.settings import Settings
from service.data import token_hashes
from service.store.store import Store, open_store
from service.store.tables import BudgetGroup, Tenant, TokenHash
from tests.api.conftest import PG_ADMIN, _pg_admin_conn


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    url = None
    if request.param == "postgresql":
        name = f"dprc_tokhash_{uuid.uuid4().hex[:12]}"
        with _pg_admin_conn() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    opened = open_store(Settings(data_dir=tmp_path / "data", database_url=url))
    with opened.sessions() as session:
        session.add(Tenant(id=1, name="t", created_at=1))
        session.flush()
        for g in ("bg-a", "bg-b", "bg-c"):
            session.add(
                BudgetGroup(
                    id=g,
                    tenant_id=1,
                    created_at=1,
                    n_examples=10,
                    epsilon_budget=5.0,
                    delta=1e-5,
                    epsilon_spent=0.0,
                    epsilon_committed=0.0,
                    privacy_unit="example",
                )
            )
        session.commit()
    yield opened
    opened.engine.dispose()
    if url is not None:
        with _pg_admin_conn() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _built(tmp: Path, name: str, texts: list[str], tokenizer) -> token_store.TokenStore:
    path = tmp / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return token_store.open_or_build(path, tokenizer, 16, "causal_lm", None, tmp / "stores")


def _rows(store: Store, group: str) -> int:
    with store.sessions() as session:
        q = select(func.count()).select_from(TokenHash).where(TokenHash.group_id == group)
        return int(session.scalar(q) or 0)


ACCENTED = [f"café number {i} à la crème" for i in range(11)]
PLAIN = [f"cafe number {i} a la creme" for i in range(11)]


def test_own_sequences_pass_others_fail(store, tmp_path, bert_tokenizer, monkeypatch):
    monkeypatch.setattr(token_hashes, "LOOKUP_CHUNK", 3)
    monkeypatch.setattr(token_hashes, "INSERT_CHUNK", 4)
    a = _built(tmp_path, "a", ACCENTED, bert_tokenizer)
    first = token_hashes.check_and_record(store, 1, "bg-a", a)
    assert first == token_hashes.Recorded(sequences=11, added=11)
    assert token_hashes.check_and_record(store, 1, "bg-a", a) == token_hashes.Recorded(11, 0)
    assert _rows(store, "bg-a") == 11
    with store.sessions() as session:  # keyed with the tenant's secret, never the raw digest
        stored = set(session.scalars(select(TokenHash.digest)))
        tokenizers = set(session.scalars(select(TokenHash.tokenizer)))
    raw = {d.hex() for chunk in a.sequence_digests() for d in chunk}
    assert len(stored) == 11 and not stored & raw
    assert tokenizers == {token_store.tokenizer_fingerprint(bert_tokenizer)}

    copy = _built(tmp_path, "b", PLAIN, bert_tokenizer)
    found = token_hashes.check_and_record(store, 1, "bg-b", copy)
    assert isinstance(found, token_hashes.Overlap)
    assert (found.group_id, found.shared, found.others) == ("bg-a", 11, 0)
    assert _rows(store, "bg-b") == 0  # nothing recorded
    # one shared sequence among new ones, on the 4th line (a blank line before it)
    mixed_texts = [f"something else {i}" for i in range(6)]
    mixed_texts[2] = PLAIN[5]
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"text": t}) for t in mixed_texts]
    path.write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n")
    mixed = token_store.open_or_build(
        path, bert_tokenizer, 16, "causal_lm", None, tmp_path / "stores"
    )
    found = token_hashes.check_and_record(store, 1, "bg-c", mixed)
    assert isinstance(found, token_hashes.Overlap) and found.shared == 1
    message = token_hashes.overlap_message(found, mixed, path, "minilm-l6-v2")
    assert message.startswith(
        "line 4 of this file tokenizes exactly as an example of data set bg-a"
    )
    assert _rows(store, "bg-c") == 0
    # another tenant's groups are not looked at
    with store.sessions() as session:
        session.add(Tenant(id=2, name="u", created_at=1))
        session.flush()
        session.add(
            BudgetGroup(
                id="bg-u",
                tenant_id=2,
                created_at=1,
                n_examples=10,
                epsilon_budget=5.0,
                delta=1e-5,
                epsilon_spent=0.0,
                epsilon_committed=0.0,
                privacy_unit="example",
            )
        )
        session.commit()
    assert token_hashes.check_and_record(store, 2, "bg-u", copy) == token_hashes.Recorded(11, 11)


def test_two_groups_racing_on_new_data_one_records_it(store, tmp_path, bert_tokenizer):
    data = _built(tmp_path, "race", [f"fresh line {i}" for i in range(40)], bert_tokenizer)
    outcomes: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def run(group: str) -> None:
        barrier.wait()
        outcomes[group] = token_hashes.check_and_record(store, 1, group, data)

    threads = [threading.Thread(target=run, args=(g,)) for g in ("bg-a", "bg-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    kinds = sorted(type(o).__name__ for o in outcomes.values())
    assert kinds == ["Overlap", "Recorded"], outcomes
    winner = next(g for g, o in outcomes.items() if isinstance(o, token_hashes.Recorded))
    loser = next(o for o in outcomes.values() if isinstance(o, token_hashes.Overlap))
    assert loser.group_id == winner and loser.shared == 40
    assert _rows(store, winner) == 40 and _rows(store, "bg-a") + _rows(store, "bg-b") == 40
