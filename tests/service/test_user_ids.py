"""A person is one unit at upload (issue 40): user ids of one type, and distinct ids that
share a 62-bit user key counted and refused (``user_key_collision``), in memory and spilled."""

from __future__ import annotations

import json

import pytest

from dprc_core.training import token_store
from service.base.errors import InvalidInput
from service.data import user_counts
from service.data.example_hashes import hash_examples, hash_file

SECRET = b"k" * 32


def _jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


@pytest.mark.parametrize(
    ("ids", "line", "shown", "kind", "first_kind"),
    [
        (["7", 7], 2, "7", "an integer", "a string"),
        ([1, 2, "7"], 3, '"7"', "a string", "an integer"),
    ],
)
def test_user_ids_of_two_types_are_refused_at_upload(tmp_path, ids, line, shown, kind, first_kind):
    data = _jsonl([{"text": f"t{i}", "user_id": u} for i, u in enumerate(ids)])
    (tmp_path / "d.jsonl").write_bytes(data)
    for attempt in (
        lambda: hash_examples(data, SECRET),
        lambda: hash_file(tmp_path / "d.jsonl", SECRET, tmp_path).__enter__(),
    ):
        with pytest.raises(InvalidInput) as refused:
            attempt()
        assert refused.value.code == "invalid_jsonl"
        assert refused.value.message.startswith(
            f"line {line}: user id {shown} is {kind} while line 1's is {first_kind}: "
            "a data set's user ids are all strings or all integers"
        )


def test_ids_of_one_type_are_counted_in_memory_and_spilled_alike(tmp_path, monkeypatch):
    # 30 users, user j with j % 4 + 1 lines: 75 lines, most 4; integers, then the same as strings
    rows = [{"text": f"u{j}-{r}", "user_id": j} for j in range(30) for r in range(j % 4 + 1)]
    as_strings = [{**r, "user_id": f"id-{r['user_id']}"} for r in rows]
    monkeypatch.setattr(user_counts, "MEMORY_KEYS", 8)
    monkeypatch.setattr(user_counts, "BUFFER_KEYS", 3)
    for data in (_jsonl(rows), _jsonl(as_strings)):
        (tmp_path / "d.jsonl").write_bytes(data)
        in_memory = hash_examples(data, SECRET).users
        with hash_file(tmp_path / "d.jsonl", SECRET, tmp_path) as streamed:
            spilled = streamed.users
            assert list(tmp_path.glob(".users-*"))  # it really spilled to partitions
        for users in (in_memory, spilled):
            assert users is not None
            assert (users.n_users, users.max_lines_per_user) == (30, 4)
    assert not list(tmp_path.glob(".users-*"))  # and removed them


@pytest.mark.parametrize("spill", [False, True])
def test_a_user_key_collision_is_counted_and_refused(tmp_path, monkeypatch, spill):
    real = token_store.user_key
    monkeypatch.setattr(user_counts, "user_key", lambda user: real(user) % 4)  # 2-bit keys
    if spill:
        monkeypatch.setattr(user_counts, "MEMORY_KEYS", 4)
        monkeypatch.setattr(user_counts, "BUFFER_KEYS", 2)
    ids = [f"person-{j}" for j in range(12)]
    collisions = len(ids) - len({real(u) % 4 for u in ids})
    assert collisions >= 8
    rows = [{"text": f"{u}/{r}", "user_id": u} for u in ids for r in range(2)]
    data = _jsonl(rows)
    (tmp_path / "d.jsonl").write_bytes(data)
    attempt = (
        (lambda: hash_file(tmp_path / "d.jsonl", SECRET, tmp_path).__enter__())
        if spill
        else (lambda: hash_examples(data, SECRET))
    )
    with pytest.raises(InvalidInput) as refused:
        attempt()
    assert refused.value.code == "invalid_jsonl"
    assert refused.value.message.startswith(
        f"user_key_collision: {collisions} of the data set's 12 distinct user ids"
    )
    # two ids on two of the 2-bit keys, each with several lines, pass: not a collision
    a = ids[0]
    b = next(u for u in ids if real(u) % 4 != real(a) % 4)
    few = _jsonl(
        [{"text": f"{u}/{r}", "user_id": u} for u, n in ((a, 3), (b, 2)) for r in range(n)]
    )
    (tmp_path / "d.jsonl").write_bytes(few)
    if spill:
        with hash_file(tmp_path / "d.jsonl", SECRET, tmp_path) as hashed:
            users = hashed.users
    else:
        users = hash_examples(few, SECRET).users
    assert users is not None and (users.n_users, users.max_lines_per_user) == (2, 3)
