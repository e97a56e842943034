"""Incremental detokenization and stop strings, one per output row.

A token may end in the middle of a UTF-8 character (byte-level tokenizers): the text decoded so
far is released only when it does not end in U+FFFD (an incomplete character), over a window of
recent tokens that starts at a character boundary (vLLM's prefix/read offsets), so the pieces
streamed concatenate to the whole decode. With stop strings, the last ``len(longest stop) - 1``
characters are held back until the row ends, so no piece of a stop string is ever streamed.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer: Any, stop: list[str]):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # decoded so far (stop strings not yet cut)
        self.sent = 0  # characters of ``text`` already handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def _advance(self, final: bool) -> None:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new = self._decode(self.ids[self.prefix_offset :])
        if len(new) > len(prefix) and (final or not new.endswith(REPLACEMENT)):
            self.text += new[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)

    def _check_stop(self, searched_from: int) -> None:
        start = max(0, searched_from - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def add(self, token: int) -> str:
        """Take one generated token; the text that may be streamed now."""
        before = len(self.text)
        self.ids.append(token)
        self._advance(final=False)
        if self.stop and len(self.text) > before:
            self._check_stop(before)
        return self._release(final=self.stopped)

    def finish(self) -> str:
        """The row has ended: the rest of the text (held characters, an incomplete tail)."""
        if not self.stopped:
            before = len(self.text)
            self._advance(final=True)
            if self.stop and len(self.text) > before:
                self._check_stop(before)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        piece = self.text[self.sent : end]
        self.sent = end
        return piece
