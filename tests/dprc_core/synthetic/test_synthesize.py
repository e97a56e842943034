"""Synthetic records: a stopped or killed run resumes to the uninterrupted run's bytes, labels
follow the given distribution (chi-square), invalid generations are drawn again, and a model
that never writes a valid record is an error, not a short file. Then the whole pipeline on a
tiny classification file: one (ε, δ) recomputed from its events, provenance, no histogram for
public labels."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
import torch
from scipy.stats import chisquare

from dprc_core.accounting import epsilon_for_events
from dprc_core.accounting.events import PrivacyEvent
from dprc_core.generation import SamplingSettings
from dprc_core.synthetic.generate import SynthesisError, SynthesisSpec, _label_of, synthesize
from dprc_core.synthetic.pipeline import make_synthetic
from dprc_core.training.models import load_model, load_tokenizer
from dprc_core.training.tiny import build_tiny_llama


@pytest.fixture(scope="module")
def byte_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "llama"
    build_tiny_llama(path, hidden=16, layers=1, max_positions=64, seed=0, tokenizer="byte")
    return path


def _spec(fmt="classification", **kw):
    extra = dict(labels=("a", "b"), label_probs=(0.25, 0.75)) if fmt == "classification" else {}
    if fmt == "chat":
        extra = dict(prompts=(({"role": "user", "content": "hi"},),))
    settings = {"seed": 5, "batch_size": 4, **extra, **kw}
    return SynthesisSpec(fmt, 11, SamplingSettings(max_new_tokens=8), **settings)


@pytest.mark.parametrize("fmt", ["text", "classification", "chat"])
def test_stopped_and_killed_runs_resume_to_the_same_file(byte_llama, tmp_path, fmt):
    model, tok = load_model(byte_llama, "causal_lm"), load_tokenizer(byte_llama)
    spec = _spec(fmt)
    whole = synthesize(model, tok, spec, tmp_path / "whole.jsonl")
    assert whole.records == 11
    lines = (tmp_path / "whole.jsonl").read_text().splitlines()
    assert len(lines) == 11 and all(json.loads(x) for x in lines)
    asked = iter([False, True])
    part = synthesize(model, tok, spec, tmp_path / "part.jsonl", should_stop=lambda: next(asked))
    assert 0 < part.records < 11
    # a kill in the middle of the next batch's write: bytes past the recorded state
    with open(tmp_path / "part.jsonl", "ab") as f:
        f.write(b'{"text": "half a rec')
    synthesize(model, tok, spec, tmp_path / "part.jsonl")
    assert (tmp_path / "part.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    again = synthesize(model, tok, spec, tmp_path / "part.jsonl")  # complete: nothing to do
    assert again.records == 11
    assert (tmp_path / "part.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_a_resume_with_other_settings_is_refused(byte_llama, tmp_path):
    model, tok = load_model(byte_llama, "causal_lm"), load_tokenizer(byte_llama)
    asked = iter([False, True])
    synthesize(model, tok, _spec(), tmp_path / "o.jsonl", should_stop=lambda: next(asked))
    with pytest.raises(SynthesisError, match="other settings"):
        synthesize(model, tok, _spec(seed=6), tmp_path / "o.jsonl")
    (tmp_path / "x.jsonl").write_text('{"text": "mine"}\n')
    with pytest.raises(SynthesisError, match="without its state"):
        synthesize(model, tok, _spec(), tmp_path / "x.jsonl")


def test_labels_follow_the_distribution():
    spec = _spec()
    n = 2000
    drawn = [_label_of(spec, i) for i in range(n)]
    counts = [drawn.count("a"), drawn.count("b")]
    assert chisquare(counts, [0.25 * n, 0.75 * n]).pvalue > 1e-3


class _Silent(torch.nn.Module):
    """A model that ends every record at once (its end token always wins)."""

    def __init__(self, inner, eos):
        super().__init__()
        self.inner, self.eos = inner, eos
        self.generation_config = inner.generation_config
        self.forward_signature = inner.forward

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits[..., self.eos] = 1e4
        return out


def test_a_model_that_writes_no_valid_record_is_an_error(byte_llama, tmp_path):
    model, tok = load_model(byte_llama, "causal_lm"), load_tokenizer(byte_llama)
    silent = _Silent(model, tok.eos_token_id)
    with pytest.raises(SynthesisError, match="does not produce the format"):
        synthesize(silent, tok, _spec("text"), tmp_path / "s.jsonl")


def test_spec_checks():
    with pytest.raises(SynthesisError, match="public prompts"):
        SynthesisSpec("chat", 3)
    with pytest.raises(SynthesisError, match="labels"):
        SynthesisSpec("classification", 3)
    with pytest.raises(SynthesisError, match="format"):
        SynthesisSpec("preference", 3)
    with pytest.raises(SynthesisError, match="n must be"):
        SynthesisSpec("text", 0)


def _classification_file(path, n=120):
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            label = rng.choice(["pos", "neg"])
            f.write(json.dumps({"text": f"it was {label} {i % 7}", "label": label}) + "\n")


@pytest.mark.filterwarnings("ignore::UserWarning")  # a 4-step run: the learnability warning
def test_make_synthetic_states_one_epsilon_for_everything_it_released(byte_llama, tmp_path):
    _classification_file(tmp_path / "train.jsonl")
    train = {
        "model": str(byte_llama),
        "train_file": str(tmp_path / "train.jsonl"),
        "epochs": 1,
        "batch_size": 30,
        "norm_method": "exact",
        "max_seq_len": 32,
        "learning_rate": 0.01,
        "token_store": str(tmp_path / "store"),
    }
    result = make_synthetic(
        train, tmp_path / "out", 6, epsilon=2.0, seed=1, sampling=SamplingSettings(max_new_tokens=6)
    )
    prov = result.provenance
    events = [PrivacyEvent.from_dict(e) for e in prov["events"]]
    assert len(events) == 2 and events[1].sample_rate == 1.0  # the steps, then the histogram
    assert result.epsilon == pytest.approx(epsilon_for_events(events, result.delta))
    assert result.epsilon <= 2.0
    assert (
        prov["source_file_sha256"]
        == hashlib.sha256((tmp_path / "train.jsonl").read_bytes()).hexdigest()
    )
    assert prov["label_histogram"]["classes"] == ["neg", "pos"]
    records = [json.loads(x) for x in result.records.read_text().splitlines()]
    assert len(records) == 6 and {r["label"] for r in records} <= {"neg", "pos"}
    public = make_synthetic(
        train,
        tmp_path / "out2",
        2,
        epsilon=2.0,
        seed=1,
        labels="uniform",
        sampling=SamplingSettings(max_new_tokens=4),
    )
    assert len(public.provenance["events"]) == 1 and public.provenance["labels"] == "public"
    assert public.epsilon <= 2.0
    with pytest.raises(ValueError, match="target_epsilon"):
        make_synthetic({**train, "target_epsilon": 1}, tmp_path / "o3", 2, epsilon=1.0)
