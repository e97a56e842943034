"""A big file hashed by worker processes (:func:`service.data.example_hashes.hash_file`, issue
45) gives exactly what one pass gives: the same sorted distinct digests, examples and format;
what it decides about the whole file from its ranges (two classes split across them, formats
that differ between them) and every refusal is the one pass's, word for word; lines naming
their users are hashed in one pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.base.errors import InvalidInput
from service.data import example_hashes
from service.data.example_hashes import hash_file

SECRET = b"s" * 32


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _hash(path: Path, tmp: Path, parallel: bool, monkeypatch) -> tuple[int, str, list[str]]:
    monkeypatch.setattr(example_hashes, "PARALLEL_MIN_BYTES", 0 if parallel else 1 << 60)
    monkeypatch.setattr(example_hashes, "hash_workers", lambda: 2)
    with hash_file(path, SECRET, tmp, 1000) as hashed:
        return hashed.n_examples, hashed.format, list(hashed.digests)


def _refusal(path: Path, tmp: Path, parallel: bool, monkeypatch) -> str:
    with pytest.raises(InvalidInput) as err:
        _hash(path, tmp, parallel, monkeypatch)
    return err.value.message


def test_workers_give_the_one_pass_digests(tmp_path, monkeypatch):
    # duplicates (after normalisation) across the ranges, and the two classes split between
    # them: labels 0 in the first half, 1 in the second
    rows = [{"text": f"line {i % 700}", "label": int(i >= 1000)} for i in range(2000)]
    rows[1500]["text"] = "LINE   3"  # the canonical key of "line 3"
    path = _write(tmp_path / "data.jsonl", rows)
    parallel = _hash(path, tmp_path, True, monkeypatch)
    assert parallel == _hash(path, tmp_path, False, monkeypatch)
    assert parallel[0] == 2000 and parallel[1] == "classification" and len(parallel[2]) == 700
    assert parallel[2] == sorted(parallel[2])
    assert not list(tmp_path.glob(".digests-*"))  # the workers' files are removed


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: rows.__setitem__(1700, {"text": ""}),  # a bad line in the second range
        lambda rows: rows.__setitem__(1700, {"text": "x"}),  # another format there
        lambda rows: [r.pop("label") or r.__setitem__("label", 0) for r in rows],  # one class
    ],
    ids=["bad line", "formats mixed", "one class"],
)
def test_workers_refuse_as_one_pass_does(tmp_path, monkeypatch, change):
    rows = [{"text": f"line {i}", "label": i % 2} for i in range(2000)]
    change(rows)
    path = _write(tmp_path / "data.jsonl", rows)
    message = _refusal(path, tmp_path, True, monkeypatch)
    assert message == _refusal(path, tmp_path, False, monkeypatch)


def test_lines_naming_users_are_hashed_in_one_pass(tmp_path, monkeypatch):
    rows = [{"text": f"line {i}", "user_id": f"u{i % 50}"} for i in range(2000)]
    path = _write(tmp_path / "data.jsonl", rows)
    monkeypatch.setattr(example_hashes, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(example_hashes, "hash_workers", lambda: 2)
    with hash_file(path, SECRET, tmp_path, 1000) as hashed:
        assert hashed.users is not None and hashed.users.n_users == 50
        assert len(hashed.digests) == 2000


def test_ascii_text_takes_a_shorter_way_to_the_same_key():
    import unicodedata

    from service.data.example_hashes import _invisible, canonical_text

    def slow(text: str) -> str:
        text = unicodedata.normalize("NFKC", text).translate(_invisible())
        return " ".join(unicodedata.normalize("NFKC", text.casefold()).split())

    texts = [chr(c) for c in range(128)] + ["  Hello\tWORLD \x1c x\x0b\x1f ", "A  b\r\nC", ""]
    texts += ["".join(chr(c) for c in range(128))]
    for text in texts:
        assert text.isascii() and canonical_text(text) == slow(text), repr(text)
