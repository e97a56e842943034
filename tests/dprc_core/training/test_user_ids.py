"""A person is one unit in the library's readers (issue 40): a data set's user ids all of one
type (7 and "7" would share a key), booleans and floats refused, and a token store whose
distinct ids share a 62-bit key refused at build (``user_key_collision``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dprc_core.training import token_store
from dprc_core.training.data import DataError, read_examples


class CharTokenizer:
    """A tiny slow tokenizer: one id a character (no download, no transformers)."""

    pad_token_id = 0
    eos_token_id = None
    truncation_side = "right"
    special_tokens_map: dict[str, str] = {}

    def get_vocab(self) -> dict[str, int]:
        return {"<pad>": 0}

    def __call__(self, texts, truncation=True, max_length=16):
        return {"input_ids": [[1 + ord(c) % 500 for c in t][:max_length] for t in texts]}


def _lines(rows: list[dict[str, Any]]) -> list[bytes]:
    return [(json.dumps(r) + "\n").encode() for r in rows]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(_lines(rows)))
    return path


@pytest.mark.parametrize("field", [None, "author"])
def test_user_ids_of_two_types_are_refused_naming_the_line(field):
    name = field or "user_id"
    rows: list[dict[str, Any]] = [
        {"text": "a", name: "7"},
        {"text": "b", name: "8"},
        {"text": "c", name: 7},
    ]
    with pytest.raises(DataError) as refused:
        list(read_examples(_lines(rows), user_field=field))
    assert str(refused.value) == (
        "line 3: user id 7 is an integer while line 1's is a string: a data set's user ids are "
        'all strings or all integers (7 and "7" would be one user)'
    )
    ints_then_str: list[dict[str, Any]] = [{"text": "a", name: 1}, {"text": "b", name: "1"}]
    with pytest.raises(DataError, match=r'^line 2: user id "1" is a string while line 1\'s'):
        list(read_examples(_lines(ints_then_str), "causal_lm", user_field=field))
    # one type throughout is read, each id as its text (blank lines do not count)
    same = [{"text": "a", name: 7}, {"text": "b", name: 70}]
    assert [e.user for e in read_examples([b"\n", *_lines(same)], user_field=field)] == [
        "7",
        "70",
    ]


@pytest.mark.parametrize("value", [True, False, 7.0, 1.5, None, "", [7], {"id": 7}])
def test_booleans_floats_and_others_are_not_user_ids(value):
    with pytest.raises(DataError, match=r"^line 1: the user field 'user_id' must be a non-empty"):
        list(read_examples(_lines([{"text": "a", "user_id": value}])))


def test_a_store_whose_ids_share_a_key_is_refused_and_none_is_left(tmp_path, monkeypatch):
    real = token_store.user_key
    ids = [f"person-{j}" for j in range(10)]
    rows = [{"text": f"{u} line {r}", "author": u} for u in ids for r in range(3)]
    path = _write(tmp_path / "d.jsonl", rows)
    root = tmp_path / "stores"
    # real keys: built, each line keyed by its author
    store = token_store.open_or_build(
        path, CharTokenizer(), 16, "causal_lm", None, root, user_field="author"
    )
    assert store.users().tolist() == [real(r["author"]) for r in rows]
    assert not list(root.glob("*/user-ids.tmp"))  # the ids' hashes are not kept
    # 2-bit keys (another store root: a new build): the collisions are counted and refused
    monkeypatch.setattr(token_store, "user_key", lambda user: real(user) % 4)
    collisions = len(ids) - len({real(u) % 4 for u in ids})
    assert collisions >= 6
    with pytest.raises(DataError, match=rf"^user_key_collision: {collisions} of the data set's 10"):
        token_store.open_or_build(
            path, CharTokenizer(), 16, "causal_lm", None, tmp_path / "other", user_field="author"
        )
    assert not [p for p in (tmp_path / "other").iterdir() if p.is_dir()]  # no store, no tmp


def test_ids_of_two_types_are_refused_when_a_store_is_built(tmp_path):
    rows: list[dict[str, Any]] = [
        {"text": "first line", "user_id": 7},
        {"text": "second line", "user_id": "7"},
    ]
    with pytest.raises(DataError, match=r'^line 2: user id "7" is a string'):
        token_store.open_or_build(
            _write(tmp_path / "d.jsonl", rows),
            CharTokenizer(),
            16,
            "causal_lm",
            None,
            tmp_path / "stores",
            user_field="user_id",
        )


def test_count_user_ids_counts_ids_keys_and_the_most_lines_of_a_key():
    keys = np.array([5, 3, 5, 5, 3, 9], dtype=np.int64)
    ids = np.array([[1, 1], [2, 0], [1, 1], [1, 2], [2, 0], [3, 3]], dtype=np.uint64)
    # key 5 holds two ids ([1, 1] twice and [1, 2]): 4 ids on 3 keys, key 5 has 3 lines
    assert token_store.count_user_ids(keys, ids) == (4, 3, 3)
    assert token_store.count_user_ids(keys[:0], ids[:0]) == (0, 0, 0)
    token_store.check_user_keys(3, 3)
    with pytest.raises(DataError, match="^user_key_collision: 1 of the data set's 4"):
        token_store.check_user_keys(4, 3)
