"""Generating a synthetic data set from a DP model: resumable, one record at a time reproducible.

Records are drawn in *attempts*, ``batch_size`` at a time (:func:`dprc_core.generation.generate`).
Attempt ``i``'s randomness is its own: its label is drawn with a generator seeded by
``derive_seed(seed, "synthetic-label", i)``, its chat prompt is ``prompts[i % len(prompts)]``
and its tokens come from a generator seeded by ``derive_seed(seed, "synthetic-record", i)``. An
attempt whose text is not a valid line of the format (empty, only whitespace) is dropped and
the next attempt counts instead, so the file holds exactly ``n`` valid records; more than
``MAX_ATTEMPTS_PER_RECORD · n`` attempts is an error (the model does not produce the format).

**Resume.** After each batch the records are appended to the output file and flushed to disk,
then a state file beside it (``<output>.state.json``: attempts done, records and bytes written,
a digest of the settings) is replaced atomically. A restarted run truncates the output to the
recorded bytes and goes on with the next batch, so it writes the same file as an uninterrupted
run (the same batches, the same seeds). The state file stays when the file is complete: run
again, the call returns at once (a caller that died after the last batch finds it done).

Nothing here reads private data: the model is a DP release, the labels' distribution is the DP
histogram's (or public), the prompts are public. The file is post-processing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dprc_core.generation import SamplingSettings, eos_ids, generate
from dprc_core.seeding import derive_seed
from dprc_core.synthetic.records import (
    SYNTHETIC_FORMATS,
    check_prompts,
    is_valid_record,
    label_prompt,
    record,
)
from dprc_core.training.chat_template import chat_template_of

MAX_ATTEMPTS_PER_RECORD = 4


class SynthesisError(ValueError):
    """The settings cannot produce the data set, or the model does not produce its format."""


@dataclass(frozen=True)
class SynthesisSpec:
    """What to generate: ``n`` records of ``format``; ``labels`` and ``label_probs`` (the
    distribution classification labels are drawn from); ``prompts`` (chat: public message
    lists, used in turn); the sampling settings; the seed of every draw; the batch size."""

    format: str
    n: int
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = 0
    batch_size: int = 16
    labels: tuple[str, ...] = ()
    label_probs: tuple[float, ...] = ()
    prompts: tuple[tuple[dict[str, str], ...], ...] = ()

    def __post_init__(self) -> None:
        if self.format not in SYNTHETIC_FORMATS:
            raise SynthesisError(f"format must be one of {SYNTHETIC_FORMATS}, got {self.format!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise SynthesisError(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise SynthesisError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.format == "classification":
            if not self.labels or len(self.labels) != len(self.label_probs):
                raise SynthesisError("a classification data set needs labels and their weights")
            if any(p < 0 for p in self.label_probs) or not sum(self.label_probs) > 0:
                raise SynthesisError("label probabilities must be >= 0 with a positive sum")
        elif self.labels:
            raise SynthesisError(f"labels are for classification data sets, not {self.format}")
        if self.format == "chat":
            if not self.prompts:
                raise SynthesisError(
                    "a chat data set's records need public prompts: the model learned the "
                    "answers only (docs/synthetic.md)"
                )
            object.__setattr__(
                self, "prompts", tuple(tuple(p) for p in check_prompts(list(self.prompts)))
            )

    def digest(self) -> str:
        """What the output depends on (the state file refuses a resume with other settings)."""
        data = asdict(self)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass
class SynthesisProgress:
    records: int
    attempts: int
    n: int


def _state_path(out: Path) -> Path:
    return out.with_name(out.name + ".state.json")


def _read_state(out: Path, spec: SynthesisSpec) -> dict[str, Any]:
    state_path = _state_path(out)
    if not state_path.exists():
        if out.exists() and out.stat().st_size > 0:
            raise SynthesisError(f"{out} exists without its state file: not a run to resume")
        return {"attempts": 0, "records": 0, "bytes": 0, "digest": spec.digest()}
    state = json.loads(state_path.read_text())
    if state.get("digest") != spec.digest():
        raise SynthesisError(f"{out} was started with other settings: not a run to resume")
    return state


def _write_state(out: Path, state: dict[str, Any]) -> None:
    path = _state_path(out)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _label_of(spec: SynthesisSpec, attempt: int) -> str:
    generator = torch.Generator().manual_seed(derive_seed(spec.seed, "synthetic-label", attempt))
    probs = torch.tensor(spec.label_probs, dtype=torch.float64)
    return spec.labels[int(torch.multinomial(probs, 1, generator=generator))]


def _prompt_ids(tokenizer: Any, spec: SynthesisSpec, attempt: int) -> tuple[list[int], Any]:
    """The prompt's token ids of attempt ``attempt`` and what the record keeps of it (its label
    or its chat prompt)."""
    if spec.format == "classification":
        label = _label_of(spec, attempt)
        return list(tokenizer(label_prompt(label))["input_ids"]), label
    if spec.format == "chat":
        messages = list(spec.prompts[attempt % len(spec.prompts)])
        text = tokenizer.apply_chat_template(
            messages,
            chat_template=chat_template_of(tokenizer),
            add_generation_prompt=True,
            tokenize=False,
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), messages
    return list(tokenizer(label_prompt(None))["input_ids"]), None


def synthesize(
    model: Any,
    tokenizer: Any,
    spec: SynthesisSpec,
    out: str | Path,
    *,
    on_progress: Callable[[SynthesisProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SynthesisProgress:
    """Write ``spec.n`` records to the JSONL file ``out`` (resuming a run that was stopped or
    killed); returns the progress, complete when ``records == n``. ``should_stop`` is asked
    between batches: True leaves the file resumable."""
    out = Path(out)
    state = _read_state(out, spec)
    with open(out, "ab"):
        pass
    with open(out, "r+b") as f:
        f.truncate(int(state["bytes"]))
    model.eval()
    stops = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    limit = MAX_ATTEMPTS_PER_RECORD * spec.n + spec.batch_size
    progress = SynthesisProgress(int(state["records"]), int(state["attempts"]), spec.n)
    while progress.records < spec.n:
        if should_stop is not None and should_stop():
            return progress
        if progress.attempts >= limit:
            raise SynthesisError(
                f"{progress.attempts} attempts gave {progress.records} valid {spec.format} "
                f"records of {spec.n}: the model does not produce the format"
            )
        attempts = range(progress.attempts, progress.attempts + spec.batch_size)
        prompts = [_prompt_ids(tokenizer, spec, a) for a in attempts]
        seeds = [derive_seed(spec.seed, "synthetic-record", a) for a in attempts]
        tokens = generate(model, [p[0] for p in prompts], seeds, spec.sampling, stops, int(pad))
        lines: list[bytes] = []
        for (_, kept), ids in zip(prompts, tokens, strict=True):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if spec.format == "classification":
                obj = record(spec.format, text, label=kept)
            elif spec.format == "chat":
                obj = record(spec.format, text, prompt=kept)
            else:
                obj = record(spec.format, text)
            if is_valid_record(obj) and progress.records + len(lines) < spec.n:
                lines.append((json.dumps(obj, ensure_ascii=False) + "\n").encode())
        with open(out, "ab") as f:
            f.write(b"".join(lines))
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        progress.records += len(lines)
        progress.attempts += spec.batch_size
        state.update(attempts=progress.attempts, records=progress.records, bytes=size)
        _write_state(out, state)
        if on_progress is not None:
            on_progress(progress)
    return progress
