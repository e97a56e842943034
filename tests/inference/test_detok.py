"""Incremental decoding never streams half a character, and stop strings are cut whole."""

from __future__ import annotations

import pytest

from inference.detok import Detokenizer

TEXT = "héllo wörld ✓ 𝄞 end"


@pytest.fixture(scope="module")
def tok():
    from dprc_core.training.tiny import byte_tokenizer

    return byte_tokenizer()


def test_multibyte_characters_stream_whole(tok):
    ids = tok(TEXT)["input_ids"]
    assert len(ids) == len(TEXT.encode())  # one token a byte: characters span tokens
    d = Detokenizer(tok, [])
    pieces = [d.add(i) for i in ids] + [d.finish()]
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)
    # a naive per-token decode would have emitted broken characters
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_an_incomplete_tail_is_flushed_at_the_end(tok):
    ids = tok("ok ✓")["input_ids"][:-1]  # the check mark's last byte missing
    d = Detokenizer(tok, [])
    text = "".join(d.add(i) for i in ids) + d.finish()
    assert text == tok.decode(ids)
    assert text.startswith("ok ") and text.endswith("\ufffd")


@pytest.mark.parametrize("stop", ["wör", "✓", "o w", "end"])
def test_stop_strings_are_cut_and_never_streamed(tok, stop):
    d = Detokenizer(tok, ["zzz", stop])
    pieces = []
    for i in tok(TEXT)["input_ids"]:
        pieces.append(d.add(i))
        if d.stopped:
            break
    pieces.append(d.finish())
    assert d.stopped
    assert "".join(pieces) == TEXT[: TEXT.index(stop)]


def test_no_stop_no_cut(tok):
    d = Detokenizer(tok, ["absent"])
    text = "".join(d.add(i) for i in tok(TEXT)["input_ids"]) + d.finish()
    assert text == TEXT and not d.stopped
