"""The tokenized store on disk (token_store.py): the same batches as tokenizing in memory
(``data.tokenize``, the reference), built once per content and settings, rebuilt — never used —
when a file fails its checksum, and nothing half-built used after a ``kill -9``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from dprc_core.training import token_store
from dprc_core.training.data import DataError, load_jsonl, tokenize


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _same_batches(store, reference, n: int) -> None:
    for index in ([0], list(range(n)), [n - 1, 3, 0, 3]):
        got, want = store.batch(index), reference.batch(index)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name


def test_classification_store_matches_in_memory_tokenization(tmp_path, bert_tokenizer):
    labels = ["neg", "pos", "10", "2"]
    rows = [
        {"text": f"review {i} " + "word " * (i % 37), "label": labels[i % 4]} for i in range(2500)
    ]
    rows[7]["label"] = 2  # an int and the string "2" are one class
    path = _write(tmp_path / "c.jsonl", rows)
    store = token_store.open_or_build(
        path, bert_tokenizer, 24, "classification", None, tmp_path / "store"
    )
    reference = tokenize(load_jsonl(path, "classification"), bert_tokenizer, 24)
    assert len(store) == len(reference) == 2500
    assert store.classes == ["2", "10", "neg", "pos"]  # label_names order
    _same_batches(store, reference, 2500)
    assert store.labels == reference.labels


def test_causal_store_reused_and_keyed_by_what_changes_ids(tmp_path, bert_tokenizer):
    path = _write(tmp_path / "t.jsonl", [{"text": f"line {i} " * (1 + i % 9)} for i in range(300)])
    root = tmp_path / "store"
    key16 = token_store.store_key(path, bert_tokenizer, 16, "causal_lm", None)
    messages: list[str] = []
    a = token_store.open_or_build(
        path, bert_tokenizer, 16, "causal_lm", None, root, messages.append
    )
    b = token_store.open_or_build(
        path, bert_tokenizer, 16, "causal_lm", None, root, messages.append
    )
    assert token_store.builds(root, key16) == 1
    assert a.path == b.path
    assert any(m.startswith("Tokenized 300 of 300") for m in messages)
    assert messages[-1].startswith("Reusing the tokenized data")
    _same_batches(b, tokenize(load_jsonl(path, "causal_lm"), bert_tokenizer, 16), 300)
    # another max_seq_len or other content: another store
    token_store.open_or_build(path, bert_tokenizer, 17, "causal_lm", None, root)
    assert len(list(root.glob("*/meta.json"))) == 2
    with path.open("a") as f:
        f.write(json.dumps({"text": "one more line"}) + "\n")
    c = token_store.open_or_build(path, bert_tokenizer, 16, "causal_lm", None, root)
    assert len(c) == 301 and token_store.builds(root, key16) == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta"])
def test_a_store_that_fails_its_checksum_is_rebuilt_not_used(tmp_path, bert_tokenizer, damage):
    path = _write(tmp_path / "t.jsonl", [{"text": f"example number {i}"} for i in range(200)])
    root = tmp_path / "store"
    first = token_store.open_or_build(path, bert_tokenizer, 12, "causal_lm", None, root)
    tokens = first.path / "tokens.u32"
    del first
    if damage == "flip":
        raw = bytearray(tokens.read_bytes())
        raw[40] ^= 0xFF
        tokens.write_bytes(bytes(raw))
    elif damage == "truncate":
        tokens.write_bytes(tokens.read_bytes()[:-8])
    else:
        (tokens.parent / "meta.json").write_text("{not json")
    messages: list[str] = []
    again = token_store.open_or_build(
        path, bert_tokenizer, 12, "causal_lm", None, root, messages.append
    )
    assert "failed its checksum" in messages[0]
    key = token_store.store_key(path, bert_tokenizer, 12, "causal_lm", None)
    assert token_store.builds(root, key) == 2
    _same_batches(again, tokenize(load_jsonl(path, "causal_lm"), bert_tokenizer, 12), 200)


def test_bad_data_is_refused_with_its_line_and_leaves_no_store(tmp_path, bert_tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"txt": "wrong"}\n')
    root = tmp_path / "store"
    with pytest.raises(DataError, match="line 3"):
        token_store.open_or_build(path, bert_tokenizer, 12, "causal_lm", None, root)
    assert not [p for p in root.iterdir() if p.is_dir()]
    with pytest.raises(DataError, match="not one of the classes"):
        token_store.open_or_build(
            _write(
                tmp_path / "c.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": "z"}]
            ),
            bert_tokenizer,
            12,
            "classification",
            ["x", "y"],
            root,
        )


def test_kill_9_while_building_leaves_nothing_a_later_build_uses(tmp_path, bert_tokenizer):
    from tests.conftest import minilm_path

    path = _write(
        tmp_path / "big.jsonl",
        [{"text": f"sentence {i} about things " * 6} for i in range(150_000)],
    )
    root = tmp_path / "store"
    script = textwrap.dedent(
        f"""
        from transformers import AutoTokenizer
        from dprc_core.training import token_store
        tok = AutoTokenizer.from_pretrained({str(minilm_path())!r})
        token_store.open_or_build({str(path)!r}, tok, 32, "causal_lm", None, {str(root)!r})
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        tmp = list(root.glob("*.tmp-*/tokens.u32")) if root.exists() else []
        if tmp and tmp[0].stat().st_size > 0:
            break
        assert proc.poll() is None, "the build ended before it could be killed"
        time.sleep(0.05)
    else:
        pytest.fail("the build never started writing")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not list(root.glob("*/meta.json"))  # nothing finished
    assert list(root.glob("*.tmp-*"))  # the killed build's folder is there…
    store = token_store.open_or_build(path, bert_tokenizer, 32, "causal_lm", None, root)
    assert not list(root.glob("*.tmp-*"))  # …and removed by the next build, never used
    assert len(store) == 150_000
    reference = tokenize(load_jsonl(path, "causal_lm"), bert_tokenizer, 32)
    _same_batches(store, reference, 150_000)
