"""What a synthetic record is, per data-set format, and how a classification file is rendered
for a generator.

* **text** lines ``{"text"}`` and **classification** lines ``{"text", "label"}``: a causal LM
  learns the text after a fixed prompt, and for classification *given* its label.
  :func:`conditioned_line` renders a line as the prompt-completion line
  ``{"prompt": "record:\\n", "completion": <text>}``, or for classification
  ``{"prompt": "label: <label>\\n", ...}`` (completion-only loss, the end token appended:
  docs/data.md, so the model learns where a record starts and where it ends), one line for one
  line, the user field kept, so the privacy unit is unchanged. A classification record is
  generated from the prompt of a label drawn from the DP label histogram
  (:mod:`dprc_core.synthetic.labels`) or from a public distribution.
* **chat** lines ``{"messages"}``: a model fine-tuned on chats learns the assistant's answers
  only (the other turns are not trained), so it cannot invent the users' turns. A record is a
  public prompt — messages the caller writes — with the generated answer appended as the
  assistant's message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dprc_core.training.data import (
    DEFAULT_USER_FIELD,
    DataError,
    read_example,
    read_examples,
)

SYNTHETIC_FORMATS = ("text", "classification", "chat")
LABEL_PROMPT = "label: {label}\n"
RECORD_PROMPT = "record:\n"


def label_prompt(label: Any) -> str:
    """The prompt a record's text is generated from: its label's, or (None) a text record's."""
    return RECORD_PROMPT if label is None else LABEL_PROMPT.format(label=label)


def conditioned_line(obj: dict[str, Any], user_field: str | None = None) -> dict[str, Any]:
    """The prompt-completion line a causal LM trains on for the text or classification line
    ``obj`` (its user field, if any, kept under the same name)."""
    ex = read_example(obj, 0, user_field)
    if ex.format not in ("text", "classification"):
        raise DataError(f"expected a text or classification line, got a {ex.format} line")
    out: dict[str, Any] = {"prompt": label_prompt(ex.label), "completion": ex.text}
    name = user_field or DEFAULT_USER_FIELD
    if name in obj:
        out[name] = obj[name]
    return out


def write_conditioned_file(
    source: str | Path, target: str | Path, user_field: str | None = None
) -> list[Any]:
    """Render a text or classification JSONL file as prompt-completion lines into ``target``
    (line for line); returns the labels in line order (None for text lines)."""
    labels: list[Any] = []
    with open(source, "rb") as src, open(target, "w", encoding="utf-8") as dst:
        for raw in src:
            if not raw.strip():
                continue
            obj = json.loads(raw)
            line = conditioned_line(obj, user_field)
            labels.append(obj.get("label"))
            dst.write(json.dumps(line, ensure_ascii=False) + "\n")
    if not labels:
        raise DataError(f"{source} holds no lines")
    if len({label is None for label in labels}) > 1:
        raise DataError(f"{source} mixes text and classification lines")
    return labels


def file_format(path: str | Path) -> str:
    """The format of a data set's lines (all lines are read and checked)."""
    with open(path, "rb") as f:
        for ex in read_examples(f):
            return ex.format
    raise DataError(f"{path} holds no lines")


def check_prompts(prompts: Sequence[Any]) -> list[list[dict[str, str]]]:
    """Public chat prompts: each a non-empty list of ``{"role", "content"}`` messages (the
    roles of a chat line) not ending with an assistant message."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of message lists")
    out: list[list[dict[str, str]]] = []
    for i, messages in enumerate(prompts):
        ex = read_example({"messages": list(messages) + [{"role": "assistant", "content": "x"}]}, i)
        assert ex.messages is not None
        kept = [{"role": m["role"], "content": m["content"]} for m in ex.messages[:-1]]
        if kept and kept[-1]["role"] == "assistant":
            raise ValueError(f"prompt {i}: must not end with an assistant message")
        out.append(kept)
    return out


def record(fmt: str, text: str, label: Any = None, prompt: Sequence[dict[str, str]] = ()) -> Any:
    """The JSONL object of one synthetic record of ``fmt``."""
    if fmt == "text":
        return {"text": text}
    if fmt == "classification":
        return {"text": text, "label": label}
    if fmt == "chat":
        return {"messages": [*prompt, {"role": "assistant", "content": text}]}
    raise ValueError(f"format must be one of {SYNTHETIC_FORMATS}, got {fmt!r}")


def is_valid_record(obj: Any) -> bool:
    """Whether ``obj`` is a line the data set's own checks accept (a generated text may be
    empty or only whitespace: such a record is drawn again)."""
    try:
        read_example(obj, 0)
    except DataError:
        return False
    return True
