"""The runner's validation loss and results CSV (tiny local Llama): valid_loss at checkpoints
equals the model's own Hugging Face loss on the validation set, scoring it leaves the training
run unchanged, and ``results.csv`` holds one row per step, also across a crash and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from dprc_core.accounting import epsilon
from dprc_core.training.data import DataError
from dprc_core.training.results import RESULT_COLUMNS, read_results
from dprc_core.training.runner import JobSpec, run_job
from dprc_core.training.tiny import build_tiny_llama
from dprc_core.training.validation import ValidationDataError


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", hidden=32)


def _write(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("data")
    train = _write(d / "train.jsonl", ["ab" * (3 + i % 4) + "." for i in range(40)])
    valid = _write(d / "valid.jsonl", ["cd" * (2 + i % 5) + "ab." for i in range(7)])
    return train, valid


def spec(tiny_dir, train, out, **kw) -> JobSpec:
    args = dict(
        model=str(tiny_dir),
        task="causal_lm",
        train_file=str(train),
        output_dir=str(out),
        epochs=1.0,
        batch_size=8,
        learning_rate=1e-2,
        max_seq_len=16,
        seed=5,
        target_epsilon=4.0,
        max_physical_batch_size=4,
        checkpoint_every=2,
    )
    args.update(kw)
    return JobSpec(**args)


def _hf_mean_loss(model_dir: Path, valid: Path) -> float:
    """Reference: the model's own loss (labels = input ids), one example at a time."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    losses = []
    with torch.no_grad():
        for line in valid.read_text().splitlines():
            ids = tok(json.loads(line)["text"], truncation=True, max_length=16, return_tensors="pt")
            losses.append(float(model(**ids, labels=ids["input_ids"]).loss))
    return sum(losses) / len(losses)


def test_valid_loss_at_checkpoints_and_one_csv_row_per_step(tiny_dir, files, tmp_path):
    train, valid = files
    seen = []
    with_valid = run_job(
        spec(tiny_dir, train, tmp_path / "v", validation_file=str(valid)), on_progress=seen.append
    )
    plain = run_job(spec(tiny_dir, train, tmp_path / "p"))
    steps = with_valid.plan.steps
    assert steps == 5  # ceil(40 / 8)
    # scoring the validation set changes nothing in the run: same weights, same ε
    a = load_file(str(Path(with_valid.checkpoint) / "model" / "model.safetensors"))
    b = load_file(str(Path(plain.checkpoint) / "model" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert with_valid.epsilon == plain.epsilon
    # valid_loss exactly at checkpoints (2, 4 and the end), equal to the HF reference
    scored = {p.step: p.valid_loss for p in seen if p.valid_loss is not None}
    assert sorted(scored) == [2, 4, 5]
    assert all(p.valid_loss is None for p in seen if p.checkpoint is None)
    last = _hf_mean_loss(Path(with_valid.checkpoint) / "model", valid)
    assert scored[5] == pytest.approx(last, rel=1e-5)
    # results.csv: one row per step, the progress values exactly
    rows = read_results((tmp_path / "v" / "results.csv").read_text())
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row, p in zip(rows, seen, strict=True):
        assert row == {
            "step": p.step,
            "train_loss": p.loss,
            "valid_loss": p.valid_loss,
            "epsilon": p.epsilon,
            "clipped_fraction": p.clipped_fraction,
            "batch_size": p.batch_size,
            "dropped": p.dropped,
        }
    plan = with_valid.plan
    want = epsilon(
        plan.noise_multiplier, plan.sample_rate, steps, plan.delta, "hutch", 32, sketch=plan.sketch
    )
    assert rows[-1]["epsilon"] == pytest.approx(want, rel=1e-12)
    header = (tmp_path / "p" / "results.csv").read_text().splitlines()[0]
    assert header == ",".join(RESULT_COLUMNS)
    assert all(
        r["valid_loss"] is None for r in read_results((tmp_path / "p" / "results.csv").read_text())
    )


def test_a_crashed_and_resumed_run_writes_the_uninterrupted_csv(tiny_dir, files, tmp_path):
    train, valid = files

    class Crash(Exception):
        pass

    def crash_at_3(p):
        if p.step == 3:
            raise Crash

    with pytest.raises(Crash):
        run_job(spec(tiny_dir, train, tmp_path / "c", validation_file=str(valid)), crash_at_3)
    assert len(read_results((tmp_path / "c" / "results.csv").read_text())) == 3
    run_job(spec(tiny_dir, train, tmp_path / "c", validation_file=str(valid)))
    run_job(spec(tiny_dir, train, tmp_path / "u", validation_file=str(valid)))
    resumed = (tmp_path / "c" / "results.csv").read_text()
    assert resumed == (tmp_path / "u" / "results.csv").read_text()
    assert len(resumed.splitlines()) == 1 + 5


def test_a_bad_validation_file_is_refused_before_any_step(tiny_dir, files, tmp_path):
    train, _ = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"label": 1}\n')
    with pytest.raises(ValidationDataError, match="validation file") as info:
        run_job(spec(tiny_dir, train, tmp_path / "b", validation_file=str(bad)))
    assert isinstance(info.value, DataError)
    assert not (tmp_path / "b" / "results.csv").exists()
