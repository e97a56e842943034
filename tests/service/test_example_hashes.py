"""Streamed validation and hashing of a data set (issue 28): :func:`hash_file` reads a file on
disk line by line and keeps its digests compact (sorted runs of 32-byte records, spilled and
merged), and agrees with the in-memory :func:`hash_examples` and with the worker's
``summarize_jsonl`` on what is valid and why not."""

from __future__ import annotations

import hashlib
import hmac
import json
import tracemalloc

import pytest

from dprc_core.training.data import DataError, read_examples, summarize_jsonl
from service.base.errors import InvalidInput
from service.data import example_hashes
from service.data.example_hashes import Digests, canonical_text, hash_examples, hash_file

SECRET = b"k" * 32


def _jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def _expected(data: bytes) -> list[str]:
    return sorted(
        {
            # the canonical key of the example's text (a chat's lines joined by newlines, which
            # it makes spaces; the other files' texts are their own keys)
            hmac.new(SECRET, canonical_text(ex.text).encode(), hashlib.sha256).hexdigest()
            for ex in read_examples(data.splitlines(keepends=True))
        }
    )


FILES = {
    "text": _jsonl([{"text": f"t{i % 7}"} for i in range(40)]),
    "chat": _jsonl(
        [
            {
                "messages": [
                    {"role": "user", "content": f"c{i}"},
                    {"role": "assistant", "content": "a"},
                ]
            }
            for i in range(5)
        ]
    ),
    "prompt-completion": _jsonl([{"prompt": f"p{i}", "completion": "c"} for i in range(3)]),
    "labels": _jsonl([{"text": f"r{i}", "label": i % 3} for i in range(9)]),
    "int-and-str-label": _jsonl([{"text": "a", "label": 1}, {"text": "b", "label": "1"}]),
    "one-label": _jsonl([{"text": "a", "label": "x"}, {"text": "b", "label": "x"}]),
    "one-line": _jsonl([{"text": "alone"}]),
    "blank": b"\n  \n",
    "mixed": _jsonl([{"text": "a"}, {"text": "b", "label": 1}]),
    "bad-json": b'{"text": "a"}\n{"text": \n',
    "bad-utf8": b'{"text": "a"}\n{"text": "\xff"}\n',
    "no-newline-at-end": b'{"text": "a"}\n{"text": "b"}',
    "crlf": b'{"text": "a"}\r\n{"text": "b"}\r\n',
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_streamed_hashing_agrees_with_the_workers_reader(name, tmp_path):
    data = FILES[name]
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    try:
        summary = summarize_jsonl(data.splitlines(keepends=True))
    except DataError as exc:
        for attempt in (
            lambda: hash_examples(data, SECRET),
            lambda: hash_file(path, SECRET, tmp_path).__enter__(),
        ):
            with pytest.raises(InvalidInput) as refused:
                attempt()
            assert refused.value.message == str(exc) and refused.value.code == "invalid_jsonl"
        return
    in_memory = hash_examples(data, SECRET)
    with hash_file(path, SECRET, tmp_path) as streamed:
        for hashed in (in_memory, streamed):
            assert (hashed.n_examples, hashed.format) == (summary.n_examples, summary.format)
            assert list(hashed.digests) == _expected(data)


def test_digests_spill_to_sorted_distinct_runs_and_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(example_hashes, "RUN_RECORDS", 8)
    monkeypatch.setattr(example_hashes, "READ_RECORDS", 3)
    monkeypatch.setattr(example_hashes, "MAX_FAN_IN", 3)  # ~30 runs: merged in passes
    rows = [{"text": f"line {i % 50}"} for i in range(237)]  # duplicates across runs
    data = _jsonl(rows)
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    expected = _expected(data)
    assert len(expected) == 50
    with hash_file(path, SECRET, tmp_path) as hashed:
        assert hashed.n_examples == 237
        digests = hashed.digests
        assert isinstance(digests, Digests) and len(digests) == 50
        assert list(digests) == expected
        assert digests[0] == expected[0] and digests[-1] == expected[-1]
        assert digests[7:19] == expected[7:19] and digests[45:99] == expected[45:]
        assert digests[::7] == expected[::7]
        with pytest.raises(IndexError):
            digests[50]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".digests-")]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".digests-")]
    assert list(hash_examples(data, SECRET).digests) == expected  # the same in memory


def test_a_line_longer_than_the_limit_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    ok = json.dumps({"text": "x" * 90}).encode()  # 102 bytes
    path.write_bytes(ok + b"\n" + ok + b"\n")
    with hash_file(path, SECRET, tmp_path, max_line_bytes=len(ok)) as hashed:
        assert hashed.n_examples == 2
    path.write_bytes(ok + b"\n" + ok + b"x\n")
    with pytest.raises(InvalidInput, match="line 2: longer than 102 bytes"):
        hash_file(path, SECRET, tmp_path, max_line_bytes=len(ok)).__enter__()


def test_memory_does_not_grow_with_the_file(tmp_path, monkeypatch):
    """100k examples (~4.5 MB) in runs of 4096: the Python heap's peak stays within a few MB
    (one run of digests, one block of each run while merging, one line), where the digests as
    hex strings alone would take ~11 MB."""
    monkeypatch.setattr(example_hashes, "RUN_RECORDS", 4096)
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        for i in range(100_000):
            fh.write(b'{"text": "example %d of a large data set"}\n' % i)
    tracemalloc.start()
    try:
        with hash_file(path, SECRET, tmp_path) as hashed:
            assert hashed.n_examples == len(hashed.digests) == 100_000
            assert sum(1 for _ in hashed.digests) == 100_000
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024**2, peak


def test_placing_digests_records_each_once_across_chunks(tmp_path, monkeypatch):
    """:func:`service.data.budget_groups.place` in chunks: a new data set's digests are inserted
    without lookups; an overlapping one joins its group and adds only the digests it lacks
    (looked up first, then inserted), whatever the chunk boundaries."""
    from sqlalchemy import func, select

    from service.base.settings import Settings
    from service.data import budget_groups
    from service.data.budget_groups import BudgetWish, place
    from service.governance.keys import create_key
    from service.store.db import locked_session
    from service.store.store import open_store
    from service.store.tables import ExampleHash, Tenant

    monkeypatch.setattr(budget_groups, "LOOKUP_CHUNK", 7)
    monkeypatch.setattr(budget_groups, "INSERT_CHUNK", 5)
    store = open_store(Settings(data_dir=tmp_path, require_budget=False))
    with store.sessions() as session:
        create_key(session, "placing", "admin")
    with store.sessions() as session:
        tenant = session.scalar(select(Tenant.id))
    first = _jsonl([{"text": f"a{i}"} for i in range(60)])
    overlapping = _jsonl(
        [{"text": f"a{i}"} for i in range(30, 60)] + [{"text": f"b{i}"} for i in range(45)]
    )
    groups = []
    for data in (first, overlapping):
        with locked_session(store.sessions) as session:
            placed = place(
                session, tenant, hash_examples(data, SECRET), BudgetWish(), store.settings
            )
            groups.append((placed.group.id, placed.joined, placed.group.n_examples))
            session.commit()
    assert groups[0][1:] == (False, 60) and groups[1][1:] == (True, 105)
    assert groups[0][0] == groups[1][0]
    with store.sessions() as session:
        rows = session.scalar(select(func.count()).select_from(ExampleHash))
        distinct = session.scalar(select(func.count(func.distinct(ExampleHash.digest))))
    assert rows == distinct == 105
    store.engine.dispose()
