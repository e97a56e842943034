"""The store's per-sequence digests (token_store.py, ``sequences.sha256``): the distinct SHA-256
of each example's token ids, sorted; equal ids (texts that differ only in what the tokenizer
erases) give one digest; built with the store, kept when it is reused, added to a store built
before them, merged from sorted runs when there are more than fit a run, and checksummed."""

from __future__ import annotations

import json
from pathlib import Path

from dprc_core.training import token_store

TEXTS = ["Café au lait", "cafe au lait", "CAFE AU LAIT", "tea", "café au lait, please"]


def _write(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _file_digests(store: token_store.TokenStore) -> list[bytes]:
    return [d for chunk in store.sequence_digests(chunk=2) for d in chunk]


def test_equal_token_ids_give_one_digest(tmp_path, bert_tokenizer):
    path = _write(tmp_path / "t.jsonl", TEXTS)
    store = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, tmp_path / "s")
    ids = [store.ids(i) for i in range(len(TEXTS))]
    assert ids[0] == ids[1] == ids[2]  # the uncased tokenizer strips the accent and the case
    assert ids[3] != ids[0] and ids[4] != ids[0]
    per_line = [token_store.sequence_digest(x) for x in ids]
    assert per_line[0] == per_line[1] == per_line[2]
    assert len(set(per_line)) == 3
    got = _file_digests(store)
    assert got == sorted(set(per_line))  # distinct, sorted bytewise
    assert store.n_sequences == 3
    assert (store.path / token_store.SEQUENCES).stat().st_size == 3 * token_store.DIGEST_SIZE
    assert token_store.SEQUENCES in store.meta["sha256"]
    assert store.tokenizer == token_store.tokenizer_fingerprint(bert_tokenizer)
    assert store.example_with_sequence(per_line[1]) == 0  # the first example with those ids
    assert store.example_with_sequence(per_line[3]) == 3
    assert store.example_with_sequence(b"\0" * 32) is None


def test_a_reused_store_keeps_its_digests(tmp_path, bert_tokenizer, monkeypatch):
    path = _write(tmp_path / "t.jsonl", TEXTS)
    root = tmp_path / "s"
    first = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, root)
    before = _file_digests(first)
    stat = (first.path / token_store.SEQUENCES).stat()

    def no_hashing(*args, **kwargs):
        raise AssertionError("a reused store computed its digests again")

    monkeypatch.setattr(token_store, "_DigestSorter", no_hashing)
    monkeypatch.setattr(token_store, "sequence_digest", no_hashing)
    again = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, root)
    assert again.path == first.path
    assert _file_digests(again) == before
    after = (again.path / token_store.SEQUENCES).stat()
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)


def test_a_store_built_before_the_digests_gets_them_once(tmp_path, bert_tokenizer):
    path = _write(tmp_path / "t.jsonl", TEXTS * 3)
    root = tmp_path / "s"
    built = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, root)
    want = _file_digests(built)
    # as a store of the version before: no sequences file, not in meta.json
    meta = json.loads((built.path / "meta.json").read_text())
    del meta["sha256"][token_store.SEQUENCES], meta["n_sequences"]
    (built.path / "meta.json").write_text(json.dumps(meta))
    (built.path / token_store.SEQUENCES).unlink()
    old = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, root)
    assert old.path == built.path
    assert _file_digests(old) == want and old.n_sequences == 3
    reopened = json.loads((old.path / "meta.json").read_text())
    assert reopened["sha256"][token_store.SEQUENCES] == token_store.file_sha256(
        old.path / token_store.SEQUENCES
    )
    key = token_store.store_key(path, bert_tokenizer, 16, "causal_lm", None)
    assert token_store.builds(root, key) == 1  # added to, not rebuilt
    assert sorted(p.name for p in old.path.iterdir()) == [
        "meta.json",
        "offsets.i64",
        token_store.SEQUENCES,
        "tokens.u32",
    ]


def test_more_digests_than_a_run_are_merged_from_runs(tmp_path, bert_tokenizer, monkeypatch):
    texts = [f"line {i % 97} of the set" for i in range(400)]  # 97 distinct, repeated
    path = _write(tmp_path / "t.jsonl", texts)
    whole = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, tmp_path / "a")
    monkeypatch.setattr(token_store, "SORT_RUN", 7)
    monkeypatch.setattr(token_store, "BUILD_BATCH", 5)
    runs = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, tmp_path / "b")
    assert _file_digests(runs) == _file_digests(whole)
    assert runs.n_sequences == whole.n_sequences == 97
    assert not list(runs.path.glob("sequences.run-*"))


def test_a_damaged_digest_file_fails_the_checksum(tmp_path, bert_tokenizer):
    path = _write(tmp_path / "t.jsonl", TEXTS)
    root = tmp_path / "s"
    first = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, root)
    want = _file_digests(first)
    seq = first.path / token_store.SEQUENCES
    raw = bytearray(seq.read_bytes())
    raw[5] ^= 0xFF
    seq.write_bytes(bytes(raw))
    messages: list[str] = []
    again = token_store.open_or_build(
        path, bert_tokenizer, 16, "causal_lm", None, root, messages.append
    )
    assert "failed its checksum" in messages[0]
    assert _file_digests(again) == want
