"""Training data: JSONL files -> validated examples -> token ids -> padded micro-batches.

One JSON object per line:

* causal LM: ``{"text": "..."}`` (every token trained), OpenAI chat format
  ``{"messages": [{"role", "content", "weight"?, "name"?}...]}`` (rendered with the chat
  template; the assistant's answers trained) or ``{"prompt": "...", "completion": "..."}`` (the
  completion trained), as TRL's SFTTrainer trains them (docs/data.md, "Chat lines")
* classification: ``{"text": "...", "label": <str or int>}``
* preference pairs (DPO, :mod:`dprc_core.preference`), OpenAI's format: ``{"input":
  {"messages": [...]}, "preferred_output": [{"role": "assistant", "content": "..."}],
  "non_preferred_output": [...]}``; one line is one pair, two sequences (the input followed by
  each output), of which only the outputs' tokens are scored (docs/data.md, "Preference lines")

The privacy unit is one line (one example). Validation stops at the first bad line and names
its number; blank lines are skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from dprc_core.training.chat_template import training_chat_template

IGNORE_INDEX = -100  # as dprc_core.losses: a label that is no target
TASKS = ("causal_lm", "classification")
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class DataError(ValueError):
    """A training file that cannot be used, with the line that is wrong."""


@dataclass
class Examples:
    task: str
    texts: list[str]
    labels: list[Any] = field(default_factory=list)  # classification only, as in the file
    # the examples themselves (chat and prompt-completion lines are tokenized from them)
    items: list[Example] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


MESSAGE_KEYS = ("role", "content", "weight", "name")


def _chat_messages(messages: Any, line: int) -> tuple[str, tuple[dict[str, Any], ...]]:
    """A chat line's text (its messages joined as ``role: content`` lines: the example's
    identity, kept as it always was) and its messages as checked: ``role`` and a string
    ``content``, optionally a string ``name``, and on assistant messages only a ``weight`` of
    0 or 1 (OpenAI's: 0 leaves the answer untrained); at least one assistant message of
    weight 1 (the default)."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"line {line}: 'messages' must be a non-empty list")
    parts = []
    out = []
    answers = 0
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DataError(f"line {line}: messages[{j}] needs a string 'content'")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise DataError(f"line {line}: messages[{j}] has role {role!r}; one of {CHAT_ROLES}")
        unknown = sorted(set(m) - set(MESSAGE_KEYS))
        if unknown:
            raise DataError(
                f"line {line}: messages[{j}] has the unsupported key {unknown[0]!r}; a message "
                f"holds {', '.join(MESSAGE_KEYS)} (weight on assistant messages only)"
            )
        if "name" in m and not isinstance(m["name"], str):
            raise DataError(f"line {line}: messages[{j}]'s 'name' must be a string")
        message: dict[str, Any] = {"role": role, "content": m["content"]}
        if "name" in m:
            message["name"] = m["name"]
        if "weight" in m:
            w = m["weight"]
            if role != "assistant":
                raise DataError(
                    f"line {line}: messages[{j}] is a {role} message with a 'weight'; only "
                    "assistant messages carry one"
                )
            if isinstance(w, bool) or w not in (0, 1):
                raise DataError(
                    f"line {line}: messages[{j}] has weight {json.dumps(w)[:40]}; a weight is "
                    "0 (not trained) or 1 (trained)"
                )
            message["weight"] = int(w)
        if role == "assistant" and message.get("weight", 1) == 1:
            answers += 1
        out.append(message)
        parts.append(f"{role}: {m['content']}")
    if answers == 0:
        has_assistant = any(m["role"] == "assistant" for m in out)
        raise DataError(
            f"line {line}: "
            + (
                "every assistant message has weight 0: nothing to train"
                if has_assistant
                else "no assistant message: nothing to train (the answers are what is trained)"
            )
        )
    return "\n".join(parts), tuple(out)


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


FORMATS = ("text", "chat", "prompt_completion", "preference", "classification")
FORMATS_FOR_TASK = {
    "causal_lm": ("text", "chat", "prompt_completion", "preference"),
    "classification": ("classification",),
}
# formats that train some tokens only
MASKED_FORMATS = ("chat", "prompt_completion", "preference")
PREFERENCE_FORMAT = "preference"  # a line is a pair: two sequences (method: dpo)
PREFERENCE_KEYS = ("input", "preferred_output", "non_preferred_output")


@dataclass(frozen=True)
class Example:
    """One line's example: its format (``text | chat | prompt_completion | classification``),
    its text (the example's identity, :mod:`service.data.example_hashes`: a text line's text,
    a chat's messages joined as ``role: content`` lines, a prompt-completion line's prompt
    immediately followed by its completion), for classification the label as in the file,
    the user the line belongs to when it says (user-level DP, docs/privacy_unit.md; never
    shown to the model), a chat's messages as checked (with their weights) or a
    prompt-completion line's two parts (what is tokenized), and the line's number. A
    preference line's ``messages`` are the input followed by the preferred output, ``rejected``
    the input followed by the non-preferred one (the input's assistant messages of weight 0:
    only the outputs are scored); its text is the input's messages, then each output's, marked
    ``preferred`` and ``non_preferred`` (which answer was preferred is part of the pair)."""

    format: str
    text: str
    label: str | int | None = None
    user: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    prompt: str | None = None
    completion: str | None = None
    line: int = field(default=0, compare=False)
    rejected: tuple[dict[str, Any], ...] | None = None


DEFAULT_USER_FIELD = "user_id"


def _pop_user(obj: dict[str, Any], line: int, user_field: str | None) -> str | None:
    """The line's user (a non-empty string or an integer), removed from ``obj``; required when
    ``user_field`` is given, optional (``user_id``) otherwise."""
    field_name = user_field or DEFAULT_USER_FIELD
    if field_name not in obj:
        if user_field is not None:
            raise DataError(f"line {line}: needs the user field {user_field!r} (user-level DP)")
        return None
    value = obj.pop(field_name)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise DataError(
            f"line {line}: the user field {field_name!r} must be a non-empty string or an "
            f"integer, got {json.dumps(value)[:40]}"
        )
    return str(value)


def _preference_example(obj: dict[str, Any], line: int, user: str | None) -> Example:
    """A preference line (OpenAI's DPO format): ``input.messages`` (no ``weight``: the input
    is never scored; its assistant messages are history), ``preferred_output`` and
    ``non_preferred_output``, each a non-empty list of assistant messages, different."""
    unknown = sorted(set(obj) - set(PREFERENCE_KEYS))
    missing = [k for k in PREFERENCE_KEYS if k not in obj]
    if missing or unknown:
        raise DataError(
            f"line {line}: a preference line is "
            '{"input": {"messages": [...]}, "preferred_output": [...], '
            '"non_preferred_output": [...]}'
            + (f"; it lacks {', '.join(repr(k) for k in missing)}" if missing else "")
            + (f"; unknown fields {unknown[:5]}" if unknown else "")
        )
    given = obj["input"]
    if not isinstance(given, dict) or set(given) != {"messages"}:
        raise DataError(f"line {line}: 'input' must be an object holding only 'messages'")
    history = given["messages"]
    if not isinstance(history, list) or not history:
        raise DataError(f"line {line}: input.messages must be a non-empty list")
    for j, m in enumerate(history):
        if isinstance(m, dict) and "weight" in m:
            raise DataError(
                f"line {line}: input.messages[{j}] has a 'weight'; the input of a preference "
                "pair is never scored (only the outputs are)"
            )
    outputs = []
    for name in ("preferred_output", "non_preferred_output"):
        out = obj[name]
        if not isinstance(out, list) or not out:
            raise DataError(f"line {line}: {name!r} must be a non-empty list of messages")
        for j, m in enumerate(out):
            if not isinstance(m, dict) or m.get("role") != "assistant" or "weight" in m:
                raise DataError(
                    f"line {line}: {name}[{j}] must be an assistant message without a weight"
                )
        outputs.append(out)
    unscored = [dict(m, weight=0) if m.get("role") == "assistant" else m for m in history]
    _, chosen = _chat_messages(unscored + outputs[0], line)
    _, rejected = _chat_messages(unscored + outputs[1], line)
    k = len(history)
    if chosen[k:] == rejected[k:]:
        raise DataError(f"line {line}: the preferred and non-preferred outputs are the same")
    text = "\n".join(
        [_joined(history), "preferred:", _joined(outputs[0])]
        + ["non_preferred:", _joined(outputs[1])]
    )
    return Example("preference", text, user=user, messages=chosen, line=line, rejected=rejected)


def _joined(messages: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _check_id_type(value: str | int, line: int, first: tuple[int, str] | None) -> tuple[int, str]:
    """A data set's user ids are all strings or all integers: ``user_key`` keys an id by its
    text, so the integer 7 and the string "7" would be one user (two people merged into one
    privacy unit, which is not safe: docs/privacy_unit.md). ``first``: the first id's line
    and type (None: this is the first id)."""
    kind = "integer" if isinstance(value, int) else "string"
    if first is None:
        return line, kind
    if kind != first[1]:
        raise DataError(
            f"line {line}: user id {json.dumps(value)[:40]} is {_article(kind)} while line "
            f"{first[0]}'s is {_article(first[1])}: a data set's user ids are all strings or "
            'all integers (7 and "7" would be one user)'
        )
    return first


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def read_example(obj: Any, line: int, user_field: str | None = None) -> Example:
    """The example of one decoded line, or :class:`DataError` naming the line and why.
    ``user_field``: the field naming the line's user, then required (else ``user_id`` is
    read when present)."""
    if not isinstance(obj, dict):
        raise DataError(f"line {line}: expected a JSON object, got {type(obj).__name__}")
    obj = dict(obj)
    user = _pop_user(obj, line, user_field)
    if any(k in obj for k in PREFERENCE_KEYS):
        return _preference_example(obj, line, user)
    if "messages" in obj:
        unknown = set(obj) - {"messages"}
        if unknown:
            raise DataError(f"line {line}: unknown fields {sorted(unknown)[:5]}")
        text, messages = _chat_messages(obj["messages"], line)
        return Example("chat", text, user=user, messages=messages, line=line)
    if "prompt" in obj or "completion" in obj:
        unknown = set(obj) - {"prompt", "completion"}
        if unknown:
            raise DataError(
                f"line {line}: unknown fields {sorted(unknown)[:5]}; a prompt-completion line "
                'is {"prompt": "...", "completion": "..."}'
            )
        prompt, completion = obj.get("prompt"), obj.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
            raise DataError(
                f"line {line}: a prompt-completion line needs a string 'prompt' and a "
                "non-empty string 'completion'"
            )
        return Example(
            "prompt_completion",
            prompt + completion,
            user=user,
            prompt=prompt,
            completion=completion,
            line=line,
        )
    unknown = set(obj) - {"text", "label"}
    if unknown:
        raise DataError(
            f"line {line}: unknown fields {sorted(unknown)[:5]}; expected "
            '{"text": ...}, {"text": ..., "label": ...}, {"messages": [...]} or '
            '{"prompt": ..., "completion": ...} (each may name its user: "user_id")'
        )
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataError(
            f"line {line}: needs a non-empty string 'text' (not only whitespace; or 'messages')"
        )
    if "label" not in obj:
        return Example("text", text, user=user, line=line)
    label = obj["label"]
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise DataError(
            f"line {line}: needs a 'label' that is a string or an integer, "
            f"got {json.dumps(label)[:40]}"
        )
    return Example("classification", text, label, user, line=line)


def _one_format(first: str | None, fmt: str, line: int) -> str:
    """The file's format after line ``line`` of format ``fmt`` (``first``: the format so far,
    None before the first example); a line of another format is :class:`DataError`."""
    if first is not None and fmt != first:
        raise DataError(f"line {line}: a {fmt} line in a {first} file (formats mixed)")
    return fmt


def read_examples(
    lines: Iterable[str | bytes], task: str | None = None, user_field: str | None = None
) -> Iterator[Example]:
    """The examples of JSONL lines, one by one (nothing but the current line is held):
    blank lines skipped, every line decoded by :func:`decode_json_line` and read by
    :func:`read_example`, all of one format (and, given ``task``, one that task takes), and
    the user ids, where lines name users, all strings or all integers (:func:`_check_id_type`).
    The upload's validation and the worker's loading both read files with this; lines are
    what a binary file (or ``io.BytesIO``) iterates: they end at ``\n`` only, so U+2028 and
    the other Unicode line separators are characters of a line (valid inside a JSON string),
    never line ends."""
    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    first: str | None = None
    id_type: tuple[int, str] | None = None  # the first user id's line and type
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        obj = decode_json_line(raw, i)
        ex = read_example(obj, i, user_field)
        if ex.user is not None:
            id_type = _check_id_type(obj[user_field or DEFAULT_USER_FIELD], i, id_type)
        if task is not None and ex.format not in FORMATS_FOR_TASK[task]:
            if task == "classification":
                raise DataError(f"line {i}: needs a 'label' (string or integer)")
            raise DataError(
                f"line {i}: unknown fields ['label']; a causal LM reads 'text', 'messages' or "
                "'prompt' and 'completion'"
            )
        first = _one_format(first, ex.format, i)
        yield ex


# The shapes of most lines of a big data set, ``{"text": "..."}`` and ``{"text": "...", "label":
# <integer or string>}``, matched on the line's bytes (JSON's whitespace between the tokens): a
# string without escapes or control characters, an integer of at most 18 digits without leading
# zeros. Whatever else a line holds (other fields or their order, escapes, a float label, a
# BOM, a byte that is not UTF-8, a blank text) does not match, and the line is read the full way.
_JSON_WS = rb"[ \t\n\r]*"
_FAST_LINE = re.compile(
    _JSON_WS
    + rb"\{"
    + _JSON_WS
    + rb'"text"'
    + _JSON_WS
    + rb":"
    + _JSON_WS
    + rb'"([^"\\\x00-\x1f]*)"'
    + _JSON_WS
    + rb"(?:,"
    + _JSON_WS
    + rb'"label"'
    + _JSON_WS
    + rb":"
    + _JSON_WS
    + rb'(?:(-?(?:0|[1-9][0-9]{0,17}))|"([^"\\\x00-\x1f]*)")'
    + _JSON_WS
    + rb")?\}"
    + _JSON_WS
    + rb"\Z"
)


def read_fields(
    lines: Iterable[str | bytes], user_field: str | None = None
) -> Iterator[tuple[str, str, str | int | None, str | None]]:
    """``(format, text, label, user)`` of each example of :func:`read_examples` ``(lines,
    user_field=user_field)``, the same examples and the same refusals (word for word), without
    an :class:`Example` for each: the upload's hashing pass. A text or classification line of
    the common shape (``_FAST_LINE``, bytes, no user field asked for) is read from the regular
    expression's groups, in about a third of the time; every other line as
    :func:`read_examples` reads it."""
    first: str | None = None
    id_type: tuple[int, str] | None = None  # the first user id's line and type
    fast = _FAST_LINE.match if user_field is None else None
    for i, raw in enumerate(lines, start=1):
        m = fast(raw) if fast is not None and isinstance(raw, bytes) else None
        if m is not None:
            body, number, word = m.groups()
            try:
                text = body.decode("utf-8")
                label: str | int | None = (
                    int(number) if number is not None else None if word is None else word.decode()
                )
            except UnicodeDecodeError:
                m = None  # named by the full reader
            else:
                if text.strip():
                    fmt = "text" if number is None and word is None else "classification"
                    first = _one_format(first, fmt, i)
                    yield fmt, text, label, None
                    continue
        if not raw.strip():
            continue
        obj = decode_json_line(raw, i)
        ex = read_example(obj, i, user_field)
        if ex.user is not None:
            id_type = _check_id_type(obj[user_field or DEFAULT_USER_FIELD], i, id_type)
        first = _one_format(first, ex.format, i)
        yield ex.format, ex.text, ex.label, ex.user


@dataclass(frozen=True)
class FileSummary:
    """What a valid data set holds: its number of examples, its format and, for a
    classification file, its classes (:func:`label_names`)."""

    n_examples: int
    format: str
    classes: list[str]


def summarize_jsonl(lines: Iterable[str | bytes], min_examples: int = 2) -> FileSummary:
    """Validate a data set line by line (memory: one line and the set of labels) with
    :func:`read_examples`; a file needs ``min_examples`` examples and, for classification,
    two classes (labels compared as :func:`label_names` compares them: ``1`` and ``"1"``
    are one class)."""
    n, fmt, labels = 0, None, set()
    for ex in read_examples(lines):
        n, fmt = n + 1, ex.format
        if ex.label is not None:
            labels.add(str(ex.label))
    if fmt is None:
        raise DataError("the file holds no examples")
    if n < min_examples:
        raise DataError(f"a data set needs at least {min_examples} examples, this one has {n}")
    classes = label_names(list(labels)) if fmt == "classification" else []
    if fmt == "classification" and len(classes) < 2:
        raise DataError(
            f"a classification data set needs at least 2 classes, this one has {len(classes)}"
        )
    return FileSummary(n, fmt, classes)


def parse_jsonl(lines: Iterable[str | bytes], task: str) -> Examples:
    """Validate JSONL lines for ``task``; raises :class:`DataError` naming the first bad line."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    out = Examples(task, [])
    for ex in read_examples(lines, task):
        out.texts.append(ex.text)
        out.items.append(ex)
        if ex.label is not None:
            out.labels.append(ex.label)
    if not out.texts:
        raise DataError("the file holds no examples")
    return out


def load_jsonl(path: str | Path, task: str) -> Examples:
    with open(path, "rb") as f:
        return parse_jsonl(f, task)  # a binary file iterates lines at b"\n", as jsonl_lines


def label_names(labels: Sequence[Any]) -> list[str]:
    """Sorted distinct labels as strings: the class index is the position in this list."""
    return sorted({str(x) for x in labels}, key=lambda s: (len(s), s))


class Batches(Protocol):
    """Tokenized examples that padded batches are sliced from: :class:`TokenizedData` (in
    memory) or :class:`dprc_core.training.token_store.TokenStore` (memory-mapped)."""

    pad_id: int

    def __len__(self) -> int: ...

    def batch(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]: ...


@dataclass
class TokenizedData:
    """Token ids per example (truncated to ``max_seq_len``), class ids for classification, and
    for chat and prompt-completion lines which tokens are trained (1) or not (0)."""

    input_ids: list[list[int]]
    labels: list[int] | None
    pad_id: int
    trained: list[list[int]] | None = None
    # preference pairs: 2 (each example two sequences, 2i preferred and 2i+1 not)
    rows_per_example: int = 1

    def __len__(self) -> int:
        return len(self.input_ids) // self.rows_per_example

    def batch(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        """A right-padded batch of the given examples (attention_mask marks real tokens);
        preference pairs as (P, 2, T) tensors (:func:`pair_batch`)."""
        if self.rows_per_example == 2:
            return pair_batch(self._rows, index)
        return self._rows(index)

    def _rows(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
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
        if self.trained is not None:
            trained = torch.zeros((len(idx), width), dtype=torch.bool)
            for row, i in enumerate(idx):
                seq = self.trained[i]
                trained[row, : len(seq)] = torch.tensor(seq, dtype=torch.bool)
            out["labels"] = token_labels(ids, trained)
        return out


def pair_batch(
    rows: Callable[[Sequence[int]], dict[str, torch.Tensor]], index: torch.Tensor | Sequence[int]
) -> dict[str, torch.Tensor]:
    """Preference pairs ``index`` as (P, 2, T) tensors, ``[:, 0]`` the preferred sequence and
    ``[:, 1]`` the other (:mod:`dprc_core.preference`'s pair layout), from ``rows(r)``, the
    padded batch of sequences ``r`` (pair i's sequences are 2i and 2i + 1)."""
    pairs = [int(i) for i in index]
    batch = rows([r for i in pairs for r in (2 * i, 2 * i + 1)])
    return {k: v.reshape(len(pairs), 2, *v.shape[1:]) for k, v in batch.items()}


def token_labels(input_ids: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Per-token labels of a causal-LM batch: the ids, -100 where a token is not trained
    (padding included: it is never marked trained)."""
    return input_ids.masked_fill(~trained.bool(), IGNORE_INDEX)


def tokenize(
    examples: Examples, tokenizer: Any, max_seq_len: int, classes: Sequence[str] | None = None
) -> TokenizedData:
    """Tokenize every example (:func:`truncated_ids`: memory bounded by ``max_seq_len``, not
    by the longest line); an example that tokenizes to nothing usable is an error (for a
    causal LM, at least two tokens are needed to have one next-token target). Chat and
    prompt-completion lines: :func:`masked_ids` (which tokens are trained)."""
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise ValueError(f"max_seq_len must be an integer >= 2, got {max_seq_len!r}")
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    if examples.items and examples.items[0].format in MASKED_FORMATS:
        pairs = masked_ids(tokenizer, examples.items, max_seq_len)
        rows = 2 if examples.items[0].format == PREFERENCE_FORMAT else 1
        seqs, trained = [p[0] for p in pairs], [p[1] for p in pairs]
        return TokenizedData(seqs, None, int(pad), trained, rows_per_example=rows)
    enc = truncated_ids(tokenizer, examples.texts, max_seq_len)
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


# Truncation before tokenization: a tokenizer's memory grows with the text it is given (about
# 200 bytes a character for a fast tokenizer's offsets and pre-tokens), so a 15 MB line would
# cost gigabytes to keep its first ``max_seq_len`` tokens. The text is cut to a window of
# WINDOW_CHARS_PER_TOKEN characters a token first; a text longer than its window is tokenized
# again in a window twice as long, until two windows give the same ``max_seq_len`` ids (the
# cut no longer changes the kept tokens), the window holds the whole text, or the window
# reaches MAX_WINDOW_CHARS_PER_TOKEN characters a token, where the text is cut whatever it
# gives (a line of more than that many characters per kept token is not ordinary text: one
# word of thousands of letters; its kept ids may then differ from the whole text's).
WINDOW_CHARS_PER_TOKEN = 8
MAX_WINDOW_CHARS_PER_TOKEN = 256


def _encode(tokenizer: Any, texts: list[str], max_seq_len: int) -> list[list[int]]:
    ids = tokenizer(texts, truncation=True, max_length=max_seq_len)["input_ids"]
    return [list(x) for x in ids]


def truncated_ids(tokenizer: Any, texts: Sequence[str], max_seq_len: int) -> list[list[int]]:
    """``tokenizer(texts, truncation=True, max_length=max_seq_len)["input_ids"]`` with memory
    bounded by ``max_seq_len``: each text is tokenized in windows (its start, or its end if
    the tokenizer truncates on the left) of at most ``MAX_WINDOW_CHARS_PER_TOKEN *
    max_seq_len`` characters, grown until the kept ids stop changing (see above)."""
    left = getattr(tokenizer, "truncation_side", "right") == "left"

    def window(text: str, size: int) -> str:
        return text[-size:] if left else text[:size]

    size0 = WINDOW_CHARS_PER_TOKEN * max_seq_len
    cap = MAX_WINDOW_CHARS_PER_TOKEN * max_seq_len
    out = _encode(tokenizer, [window(t, size0) for t in texts], max_seq_len)
    for i, text in enumerate(texts):
        size = size0
        while len(text) > size and size < cap:
            size = min(2 * size, cap)
            longer = _encode(tokenizer, [window(text, size)], max_seq_len)[0]
            if longer == out[i] and len(longer) == max_seq_len:
                break  # two windows keep the same max_seq_len ids: the cut changes nothing
            out[i] = longer
    return out


# Chat and prompt-completion lines (docs/data.md, "Chat lines"): tokenized as TRL's SFTTrainer
# tokenizes them, with a mask of the tokens trained, then cut to their first ``max_seq_len``
# tokens (the start is kept, whatever the tokenizer's truncation side). Memory stays bounded by
# ``max_seq_len``: the text tokenized (the rendered chat; the prompt, and the prompt and
# completion) is cut to windows as :func:`truncated_ids` cuts a text line's, growing from
# WINDOW_CHARS_PER_TOKEN to at most MAX_WINDOW_CHARS_PER_TOKEN characters a kept token.


def _windowed_encodings(
    tokenizer: Any, texts: Sequence[str], max_seq_len: int, add_special_tokens: bool
) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Each text's first ``max_seq_len`` ids and their character offsets, tokenized without
    truncation from a window of the text's start (see above)."""

    def encode(batch: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        out = tokenizer(batch, add_special_tokens=add_special_tokens)
        encodings = getattr(out, "encodings", None)
        if encodings is None:
            raise DataError(
                "chat and prompt-completion lines need a fast tokenizer (with offsets): "
                f"{type(tokenizer).__name__} is not one"
            )
        return [(list(e.ids), [tuple(o) for o in e.offsets]) for e in encodings]

    size0 = WINDOW_CHARS_PER_TOKEN * max_seq_len
    cap = MAX_WINDOW_CHARS_PER_TOKEN * max_seq_len
    full = encode([t[:size0] for t in texts]) if texts else []
    out = [(ids[:max_seq_len], offs[:max_seq_len]) for ids, offs in full]
    for i, text in enumerate(texts):
        size = size0
        long_enough = len(full[i][0]) > max_seq_len
        while len(text) > size and size < cap:
            size = min(2 * size, cap)
            ids, offs = encode([text[:size]])[0]
            longer = (ids[:max_seq_len], offs[:max_seq_len])
            same = longer[0] == out[i][0]
            out[i] = longer
            if same and long_enough and len(ids) > max_seq_len:
                break  # two windows keep the same ids, and more follow: the cut changes nothing
            long_enough = len(ids) > max_seq_len
    return out


def _chat_masks(
    tokenizer: Any, chats: Sequence[Example], template: str, max_seq_len: int
) -> list[tuple[list[int], list[int]]]:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, spans = [], []
    specials = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    for ex in chats:
        assert ex.messages is not None
        messages = [{k: v for k, v in m.items() if k != "weight"} for m in ex.messages]
        try:
            texts, indices = render_jinja_template(  # type: ignore[str-unpack] # (str, spans)
                conversations=[messages],
                chat_template=template,
                return_assistant_tokens_mask=True,
                add_generation_prompt=False,
                **specials,
            )
        except Exception as exc:  # a template's own raise_exception, or a Jinja error
            raise DataError(f"line {ex.line}: the chat template fails on it: {exc}") from exc
        answers = [m for m in ex.messages if m["role"] == "assistant"]
        if len(indices[0]) != len(answers):
            raise DataError(
                f"line {ex.line}: the chat template marks {len(indices[0])} answer(s) with "
                f"{{% generation %}} for the line's {len(answers)} assistant message(s): it does "
                "not mark each answer once, so what is trained cannot be told (give the "
                'tokenizer a template that does: docs/data.md, "Chat lines")'
            )
        rendered.append(texts[0])
        spans.append(
            [span for span, m in zip(indices[0], answers, strict=True) if m.get("weight", 1)]
        )
    out = []
    for (ids, offsets), kept in zip(
        _windowed_encodings(tokenizer, rendered, max_seq_len, False), spans, strict=True
    ):
        out.append((ids, _overlap_mask(offsets, kept)))
    return out


def _overlap_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[Any]) -> list[int]:
    """1 for every token overlapping a span, as ``apply_chat_template``'s
    ``return_assistant_tokens_mask`` marks them (spans and offsets both in order)."""
    mask = [0] * len(offsets)
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[t] = 1
    return mask


def _completion_masks(
    tokenizer: Any, items: Sequence[Example], max_seq_len: int
) -> list[tuple[list[int], list[int]]]:
    eos = getattr(tokenizer, "eos_token", None)
    prompts, wholes = [], []
    for ex in items:
        assert ex.prompt is not None and ex.completion is not None
        completion = ex.completion
        if isinstance(eos, str) and eos and not completion.endswith(eos):
            completion += eos  # TRL's add_eos: the model learns to stop
        prompts.append(ex.prompt)
        wholes.append(ex.prompt + completion)
    prompt_ids = _windowed_encodings(tokenizer, prompts, max_seq_len, True)
    whole_ids = _windowed_encodings(tokenizer, wholes, max_seq_len, True)
    out = []
    for (p, _), (ids, _) in zip(prompt_ids, whole_ids, strict=True):
        n = _common_prefix_length(p, ids)  # TRL's common_prefix_length
        out.append((ids, [0] * n + [1] * (len(ids) - n)))
    return out


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def masked_ids(
    tokenizer: Any, items: Sequence[Example], max_seq_len: int
) -> list[tuple[list[int], list[int]]]:
    """The token ids of chat or prompt-completion examples, cut to ``max_seq_len``, and which
    of them are trained (1), as TRL's SFTTrainer builds them (``assistant_only_loss`` for
    chats: the tokens of the answers of weight 1, read from the chat template's generation
    spans as ``apply_chat_template`` reads them; completion-only loss for prompt-completion
    lines: the tokens after the prompt's, the completion ending with the end-of-sequence
    token). A line left with no trained target (the label at position 0 is none: the loss
    predicts each token from the ones before it) is :class:`DataError` naming its line."""
    if not items:
        return []
    if items[0].format == PREFERENCE_FORMAT:
        return _preference_masks(tokenizer, items, max_seq_len)
    if items[0].format == "chat":
        try:
            template = training_chat_template(tokenizer)
        except ValueError as exc:
            raise DataError(str(exc)) from exc
        out = _chat_masks(tokenizer, items, template, max_seq_len)
    elif items[0].format == "prompt_completion":
        out = _completion_masks(tokenizer, items, max_seq_len)
    else:
        raise ValueError(f"masked_ids reads chat and prompt_completion lines: {items[0].format}")
    for ex, (_, mask) in zip(items, out, strict=True):
        if not any(mask[1:]):
            what = "answer" if ex.format == "chat" else "completion"
            raise DataError(
                f"line {ex.line}: no {what} token is left to train in its first {max_seq_len} "
                f"tokens (max_seq_len): shorten what comes before the {what} or raise max_seq_len"
            )
    return out


def _preference_masks(
    tokenizer: Any, items: Sequence[Example], max_seq_len: int
) -> list[tuple[list[int], list[int]]]:
    """Two entries per preference pair, the preferred sequence then the non-preferred one: each
    its input and output rendered as a chat (:func:`_chat_masks`), the output's tokens marked
    (the ones whose log-probability DPO sums). A pair either of whose outputs keeps no token in
    its first ``max_seq_len`` is :class:`DataError` naming its line."""
    try:
        template = training_chat_template(tokenizer)
    except ValueError as exc:
        raise DataError(str(exc)) from exc
    chats = []
    for ex in items:
        assert ex.messages is not None and ex.rejected is not None
        chats.append(Example("chat", ex.text, messages=ex.messages, line=ex.line))
        chats.append(Example("chat", ex.text, messages=ex.rejected, line=ex.line))
    out = _chat_masks(tokenizer, chats, template, max_seq_len)
    for j, (_, mask) in enumerate(out):
        if not any(mask[1:]):
            which = "preferred" if j % 2 == 0 else "non-preferred"
            raise DataError(
                f"line {chats[j].line}: no token of the {which} output is left in its first "
                f"{max_seq_len} tokens (max_seq_len): shorten the input or raise max_seq_len"
            )
    return out
