"""The pretrained MiniLM through the job runner: DP linear probe (hutch k = 32) at ε = 8 on the
review data shipped in data/demo/ reaches clearly better than chance held-out accuracy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dprc_core.training.data import load_jsonl, tokenize
from dprc_core.training.models import load_model, load_tokenizer
from dprc_core.training.runner import JobSpec, evaluate, run_job
from tests.conftest import minilm_path

DATA = Path(__file__).resolve().parents[3] / "data" / "demo"


@pytest.mark.slow
def test_minilm_classification_beats_chance_at_epsilon_8(tmp_path):
    spec = JobSpec(
        model=str(minilm_path()),
        task="classification",
        train_file=str(DATA / "reviews_train.jsonl"),
        output_dir=str(tmp_path / "run"),
        epochs=4,
        batch_size=64,
        learning_rate=0.1,
        max_seq_len=32,
        target_epsilon=8.0,
        norm_method="hutch",
        k=32,
        seed=0,
        train_only=["classifier"],
        max_physical_batch_size=64,
    )
    result = run_job(spec)
    assert result.status == "succeeded" and result.epsilon <= 8.0
    model = load_model(Path(result.checkpoint) / "model", "classification", num_labels=2)
    classes = [model.config.id2label[i] for i in range(2)]
    test = tokenize(
        load_jsonl(DATA / "reviews_test.jsonl", "classification"),
        load_tokenizer(minilm_path()),
        32,
        classes,
    )
    torch.manual_seed(0)
    accuracy = evaluate(model, test, "classification")
    n = len(test)
    # balanced classes: a chance-level classifier has accuracy 0.5 ± sqrt(0.25/n); require
    # more than 5 standard deviations above it (false-pass probability < 3e-7)
    assert accuracy > 0.5 + 5 * math.sqrt(0.25 / n), accuracy
