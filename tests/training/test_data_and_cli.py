"""JSONL validation (first bad line named), tokenization, the privacy plan, `dprc train`."""

from __future__ import annotations

import json
import math

import pytest

from dprc_core.accounting import epsilon
from dprc_core.cli import main
from dprc_core.training.data import DataError, parse_jsonl, tokenize
from dprc_core.training.plan import default_delta, plan_privacy
from dprc_core.training.tiny import build_tiny_llama, char_tokenizer


@pytest.mark.parametrize(
    "lines, task, match",
    [
        (['{"text": "a"}', "not json"], "causal_lm", "line 2: not valid JSON"),
        (['{"text": "a"}', "", "[1, 2]"], "causal_lm", "line 3: expected a JSON object"),
        (['{"text": ""}'], "causal_lm", "line 1: needs a non-empty string"),
        (['{"text": "a", "x": 1}'], "causal_lm", r"line 1: unknown fields \['x'\]"),
        (['{"messages": [{"role": "robot", "content": "hi"}]}'], "causal_lm", "role 'robot'"),
        (
            ['{"text": "a", "label": 1}', '{"text": "b"}'],
            "classification",
            "line 2: needs a 'label'",
        ),
        (['{"text": "a", "label": true}'], "classification", "line 1: needs a 'label'"),
        ([], "causal_lm", "no examples"),
    ],
)
def test_bad_jsonl_names_the_first_bad_line(lines, task, match):
    with pytest.raises(DataError, match=match):
        parse_jsonl(lines, task)


def test_chat_format_and_classification_labels():
    ex = parse_jsonl(
        [
            '{"messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": "yo"}]}'
        ],
        "causal_lm",
    )
    assert ex.texts == ["user: hi\nassistant: yo"]
    cls = parse_jsonl(
        [
            '{"text": "a", "label": "neg"}',
            '{"text": "b", "label": "pos"}',
            '{"text": "c", "label": "neg"}',
        ],
        "classification",
    )
    tok = tokenize(cls, char_tokenizer(), max_seq_len=8)
    assert tok.labels == [0, 1, 0]
    batch = tok.batch([0, 1])
    assert batch["input_ids"].shape == (2, 1) and batch["labels"].tolist() == [0, 1]


def test_examples_that_tokenize_to_nothing_are_refused():
    ex = parse_jsonl(['{"text": "ab"}', '{"text": "x"}'], "causal_lm")
    with pytest.raises(DataError, match="example 2 tokenizes to 1 token"):
        tokenize(ex, char_tokenizer(), max_seq_len=8)


@pytest.mark.parametrize("n", [2, 10, 64, 1000, 12345, 10**6])
def test_default_delta_is_at_most_n_to_the_minus_1_1(n):
    d = default_delta(n)
    assert 0 < d <= n**-1.1 < 1 / n
    assert d >= 0.9 * n**-1.1  # two significant digits, rounded down


def test_plan_rounds_steps_up_and_meets_the_target():
    plan = plan_privacy(
        dataset_size=1000, batch_size=64, epochs=2.5, clipping="hutch", k=32, target_epsilon=3.0
    )
    assert plan.steps == math.ceil(2.5 * 1000 / 64) and plan.sample_rate == 0.064
    eps = epsilon(plan.noise_multiplier, 0.064, plan.steps, plan.delta, "hutch", 32)
    assert eps <= 3.0 and plan.planned_epsilon == pytest.approx(eps, rel=1e-12)
    for bad in (dict(batch_size=2000), dict(epochs=0), dict(batch_size=True)):
        args = dict(
            dataset_size=1000, batch_size=64, epochs=1, clipping="exact", k=None, target_epsilon=3.0
        )
        args.update(bad)
        with pytest.raises(ValueError):
            plan_privacy(**args)


@pytest.mark.parametrize(
    "epochs,n,b,steps",
    [(0.1, 30, 1, 3), (0.7, 10, 7, 1), (3, 1000, 64, 47), (2.5, 999, 37.5, 67), (0.3, 10, 1, 3)],
)
def test_plan_steps_are_the_decimal_ceiling(epochs, n, b, steps):
    # ⌈epochs·N/B⌉ of the numbers as written: 0.1 epochs of 30 examples at B = 1 is 3 steps
    # (float arithmetic: 0.1*30 = 3.0000000000000004 would add a fourth)
    plan = plan_privacy(
        dataset_size=n,
        batch_size=b,
        epochs=epochs,
        clipping="exact",
        k=None,
        noise_multiplier_value=1.0,
    )
    assert plan.steps == steps


def test_dprc_train_runs_a_yaml_job_and_resumes(tmp_path, capsys):
    build_tiny_llama(tmp_path / "m", hidden=32)
    (tmp_path / "t.jsonl").write_text(
        "\n".join(json.dumps({"text": "ab" * (3 + i % 4)}) for i in range(40))
    )
    (tmp_path / "job.yaml").write_text(
        "model: m\ntask: causal_lm\ntrain_file: t.jsonl\noutput_dir: out\nepochs: 0.5\n"
        "batch_size: 8\nmax_seq_len: 16\ntarget_epsilon: 4\nseed: 1\n"
    )
    assert main(["train", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "succeeded" and out["steps_done"] == out["steps"] == 3
    assert out["epsilon"] <= 4.0
    assert main(["train", str(tmp_path / "job.yaml"), "--no-resume", "--quiet"]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("model: m\ntask: translation\n")
    assert main(["train", str(tmp_path / "bad.yaml")]) == 2


def test_the_job_field_norm_method_and_its_deprecated_spelling_clipping():
    from dprc_core.training.runner import JobSpec

    base = {"model": "m", "task": "causal_lm", "train_file": "t.jsonl", "output_dir": "o"}
    assert JobSpec.from_dict({**base, "norm_method": "exact"}).norm_method == "exact"
    with pytest.warns(DeprecationWarning, match="norm_method"):
        old = JobSpec.from_dict({**base, "clipping": "hutchpp"})
    assert old.norm_method == "hutchpp" and old.clipping is None
    with pytest.raises(ValueError, match="norm_method must be one of"):
        JobSpec.from_dict({**base, "norm_method": "nope"})
