"""Training data: JSONL files -> validated examples -> token ids -> padded micro-batches.

One JSON object per line:

* causal LM: ``{"text": "..."}`` or OpenAI chat format ``{"messages": [{"role", "content"}...]}``
* classification: ``{"text": "...", "label": <str or int>}``

The privacy unit is one line (one example). Validation stops at the first bad line and names
its number; blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TASKS = ("causal_lm", "classification")
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class DataError(ValueError):
    """A training file that cannot be used, with the line that is wrong."""


@dataclass
class Examples:
    task: str
    texts: list[str]
    labels: list[Any] = field(default_factory=list)  # classification only, as in the file

    def __len__(self) -> int:
        return len(self.texts)


def _chat_text(messages: Any, line: int) -> str:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"line {line}: 'messages' must be a non-empty list")
    parts = []
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DataError(f"line {line}: messages[{j}] needs a string 'content'")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise DataError(f"line {line}: messages[{j}] has role {role!r}; one of {CHAT_ROLES}")
        parts.append(f"{role}: {m['content']}")
    return "\n".join(parts)


def jsonl_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSONL file: lines end at ``\n`` only, as a file iterates —
    U+2028 and other Unicode line separators are characters of a line, not line ends."""
    for i, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            yield i, raw


def decode_json_line(raw: str | bytes, line: int) -> Any:
    """One line's JSON value, or :class:`DataError` naming the line: not UTF-8, not JSON,
    nested too deeply, an integer too long to convert, or a string with an unpaired surrogate
    (``"\\ud800"``: no tokenizer can encode it)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"line {line}: not valid UTF-8 ({exc.reason})") from exc
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"line {line}: not valid JSON ({exc.msg})") from exc
    except RecursionError as exc:
        raise DataError(f"line {line}: JSON nested too deeply") from exc
    except ValueError as exc:  # e.g. an integer literal of thousands of digits
        raise DataError(f"line {line}: not usable JSON ({exc})") from exc
    _check_strings(value, line)
    return value


def _check_strings(value: Any, line: int) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise DataError(f"line {line}: a string holds an unpaired surrogate") from exc
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def parse_jsonl(lines: Iterable[str | bytes], task: str) -> Examples:
    """Validate JSONL lines for ``task``; raises :class:`DataError` naming the first bad line."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    out = Examples(task, [])
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        obj = decode_json_line(raw, i)
        if not isinstance(obj, dict):
            raise DataError(f"line {i}: expected a JSON object, got {type(obj).__name__}")
        text: object  # a JSON value until checked to be a string below
        if task == "causal_lm":
            if "messages" in obj:
                unknown = set(obj) - {"messages"}
                text = _chat_text(obj["messages"], i)
            else:
                unknown = set(obj) - {"text"}
                text = obj.get("text")
            if unknown:
                raise DataError(f"line {i}: unknown fields {sorted(unknown)}")
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"line {i}: needs a non-empty string 'text' (or 'messages')")
            out.texts.append(text)
        else:
            unknown = set(obj) - {"text", "label"}
            if unknown:
                raise DataError(f"line {i}: unknown fields {sorted(unknown)}")
            text, label = obj.get("text"), obj.get("label")
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"line {i}: needs a non-empty string 'text'")
            if isinstance(label, bool) or not isinstance(label, (str, int)):
                raise DataError(f"line {i}: needs a 'label' (string or integer)")
            out.texts.append(text)
            out.labels.append(label)
    if not out.texts:
        raise DataError("the file holds no examples")
    return out


def load_jsonl(path: str | Path, task: str) -> Examples:
    with open(path, "rb") as f:
        return parse_jsonl(f, task)  # a binary file iterates lines at b"\n", as jsonl_lines


def label_names(labels: Sequence[Any]) -> list[str]:
    """Sorted distinct labels as strings: the class index is the position in this list."""
    return sorted({str(x) for x in labels}, key=lambda s: (len(s), s))


@dataclass
class TokenizedData:
    """Token ids per example (truncated to ``max_seq_len``) and class ids for classification."""

    input_ids: list[list[int]]
    labels: list[int] | None
    pad_id: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def batch(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        """A right-padded batch of the given examples (attention_mask marks real tokens)."""
        idx = [int(i) for i in index]
        width = max((len(self.input_ids[i]) for i in idx), default=1)
        ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            seq = self.input_ids[i]
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if self.labels is not None:
            out["labels"] = torch.tensor([self.labels[i] for i in idx], dtype=torch.long)
        return out


def tokenize(
    examples: Examples, tokenizer: Any, max_seq_len: int, classes: Sequence[str] | None = None
) -> TokenizedData:
    """Tokenize every example; an example that tokenizes to nothing usable is an error (for a
    causal LM, at least two tokens are needed to have one next-token target)."""
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise ValueError(f"max_seq_len must be an integer >= 2, got {max_seq_len!r}")
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    enc = tokenizer(examples.texts, truncation=True, max_length=max_seq_len)["input_ids"]
    need = 2 if examples.task == "causal_lm" else 1
    for i, ids in enumerate(enc):
        if len(ids) < need:
            raise DataError(
                f"example {i + 1} tokenizes to {len(ids)} token(s); a {examples.task} example "
                f"needs at least {need}"
            )
    labels = None
    if examples.task == "classification":
        classes = list(classes) if classes is not None else label_names(examples.labels)
        index = {c: j for j, c in enumerate(classes)}
        try:
            labels = [index[str(x)] for x in examples.labels]
        except KeyError as exc:
            raise DataError(f"label {exc.args[0]!r} is not one of the classes {classes}") from exc
    return TokenizedData([list(x) for x in enc], labels, int(pad))
