"""DP DPO in the runner (issue 43): preference lines in OpenAI's format, their pairs as (P, 2, T)
batches with only the outputs scored, the reference log-probabilities of the starting model
(kept with the store, read back, recomputed when altered, the base model's for LoRA), a
resumed run equal to the uninterrupted one, user-level units and ν-DP-FTRL on pairs, and the
refusals (a method and a file that do not agree, a line left with nothing to score)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dprc_core.training import token_store
from dprc_core.training.data import DataError, load_jsonl, read_examples, tokenize
from dprc_core.training.models import load_model, load_tokenizer
from dprc_core.training.reference import REFERENCE_DIR
from dprc_core.training.runner import JobSpec, run_job
from dprc_core.training.tiny import build_tiny_llama
from dprc_core.training.validation import ValidationDataError


def pair(i: int, user: str | None = None) -> dict:
    c = "abcdefgh"[i % 8]
    row = {
        "input": {
            "messages": [
                {"role": "user", "content": f"echo {c}"},
                {"role": "assistant", "content": "ok"},  # history: never scored
                {"role": "user", "content": f"again #{i}"},
            ]
        },
        "preferred_output": [{"role": "assistant", "content": c * 3}],
        "non_preferred_output": [{"role": "assistant", "content": c.upper() * 2}],
    }
    if user is not None:
        row["user_id"] = user
    return row


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("dpo") / "llama", hidden=32)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("dpo-data") / "pairs.jsonl", [pair(i) for i in range(24)])


def dpo_spec(model: Path, train: Path, out: Path, **kw) -> JobSpec:
    fields = dict(
        model=str(model),
        task="causal_lm",
        train_file=str(train),
        output_dir=str(out),
        epochs=1.0,
        batch_size=8,
        learning_rate=0.01,
        max_seq_len=128,
        seed=5,
        target_epsilon=4.0,
        max_physical_batch_size=4,
        norm_method="exact",
        token_store=str(out.parent / "stores"),
        method="dpo",
        beta=0.5,
    )
    fields.update(kw)
    return JobSpec(**fields)


def weights(ckpt: str) -> dict[str, torch.Tensor]:
    """The checkpoint's trained weights: the model's, or a LoRA adapter's."""
    (path,) = (Path(ckpt) / "model").glob("*.safetensors")
    return load_file(str(path))


# ------------------------------------------------------------------------------ the lines

BAD = {
    "no non-preferred output": ({"non_preferred_output": None}, "lacks 'non_preferred_output'"),
    "no preferred output": ({"preferred_output": None}, "lacks 'preferred_output'"),
    "input without messages": ({"input": {"text": "x"}}, "holding only 'messages'"),
    "an output by the user": (
        {"preferred_output": [{"role": "user", "content": "x"}]},
        "must be an assistant message",
    ),
    "a weight on an output": (
        {"preferred_output": [{"role": "assistant", "content": "x", "weight": 1}]},
        "without a weight",
    ),
    "a weight in the input": (
        {"input": {"messages": [{"role": "user", "content": "x", "weight": 0}]}},
        "never scored",
    ),
    "the same outputs": (
        {"non_preferred_output": [{"role": "assistant", "content": "aaa"}]},
        "are the same",
    ),
    "an unknown field": ({"score": 3}, "unknown fields"),
    "an empty output": ({"preferred_output": []}, "non-empty list"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_preference_lines_are_refused_with_their_number(case):
    change, match = BAD[case]
    row = {**pair(0)}
    for key, value in change.items():
        if value is None:
            row.pop(key)
        else:
            row[key] = value
    lines = [json.dumps(pair(1)), json.dumps(row)]
    with pytest.raises(DataError, match=f"line 2: .*{match}"):
        list(read_examples(lines, "causal_lm"))


def test_a_pairs_identity_holds_both_outputs_and_which_was_preferred():
    (a,) = read_examples([json.dumps(pair(0))])
    swapped = {
        **pair(0),
        "preferred_output": pair(0)["non_preferred_output"],
        "non_preferred_output": pair(0)["preferred_output"],
    }
    (b,) = read_examples([json.dumps(swapped)])
    assert a.format == b.format == "preference"
    assert "aaa" in a.text and "AA" in a.text and a.text != b.text


def test_pairs_are_batched_with_only_the_outputs_scored(tiny, pairs_file, tmp_path):
    tok = load_tokenizer(tiny)
    store = token_store.open_or_build(pairs_file, tok, 128, "causal_lm", None, tmp_path)
    assert len(store) == 24 and store.rows_per_example == 2
    batch = store.batch([3, 0])
    assert batch["input_ids"].shape[:2] == (2, 2)
    in_memory = tokenize(load_jsonl(pairs_file, "causal_lm"), tok, 128).batch([3, 0])
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(batch[key], in_memory[key])
    for p, i in enumerate((3, 0)):
        row = pair(i)
        for a, output in enumerate((row["preferred_output"], row["non_preferred_output"])):
            labels = batch["labels"][p, a]
            scored = labels[labels != -100].tolist()
            # the output's tokens and the end token, found from the text independently
            want = tok(output[0]["content"], add_special_tokens=False)["input_ids"]
            assert scored == want + [tok.eos_token_id]
            at = (labels != -100).nonzero().flatten().tolist()
            assert at == list(range(at[0], at[0] + len(scored)))  # one span: the output's
            ids = batch["input_ids"][p, a].tolist()
            assert ids[at[0] : at[-1] + 1] == scored
            assert at[0] > len(tok("echo a ok again #0")["input_ids"])  # after the input
        # both sequences share the rendered input, and the history's answer is not scored
        first = (batch["labels"][p] != -100).int().argmax(-1)
        assert torch.equal(
            batch["input_ids"][p, 0, : int(first[0])], batch["input_ids"][p, 1, : int(first[1])]
        )


def test_an_output_cut_away_by_max_seq_len_names_the_line(tiny, tmp_path):
    long_input = pair(0)
    long_input["input"]["messages"][0]["content"] = "x" * 200
    path = write(tmp_path / "long.jsonl", [pair(1), long_input])
    with pytest.raises(DataError, match="line 2: no token of the preferred output"):
        tokenize(load_jsonl(path, "causal_lm"), load_tokenizer(tiny), 128)


# ------------------------------------------------------------------------------ the job


def independent_logps(model, tok, row: dict) -> list[float]:
    """log π(output | input) of a pair's two outputs: each sequence alone (no padding), the
    output's tokens located from its text."""
    out = []
    for output in (row["preferred_output"], row["non_preferred_output"]):
        messages = row["input"]["messages"] + output
        from dprc_core.training.chat_template import DEFAULT_CHAT_TEMPLATE

        text = tok.apply_chat_template(
            messages, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        answer = tok(output[0]["content"], add_special_tokens=False)["input_ids"]
        answer = answer + [tok.eos_token_id]
        start = max(i for i in range(len(ids)) if ids[i : i + len(answer)] == answer)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        out.append(sum(float(logp[t - 1, ids[t]]) for t in range(start, start + len(answer))))
    return out


@pytest.mark.parametrize("lora", [False, True])
def test_the_reference_is_the_starting_model_kept_with_the_store(
    tiny, pairs_file, tmp_path, monkeypatch, lora
):
    kw = {"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}} if lora else {}
    result = run_job(dpo_spec(tiny, pairs_file, tmp_path / "a", **kw))
    assert result.status == "succeeded" and result.plan.dataset_size == 24
    kept = list((tmp_path / "stores").glob(f"*/{REFERENCE_DIR}/*.f64"))
    assert len(kept) == 1
    import numpy as np

    ref = np.fromfile(kept[0], dtype=np.float64).reshape(24, 2)
    base = load_model(tiny, "causal_lm").eval()
    tok = load_tokenizer(tiny)
    for i in (0, 5, 23):
        assert ref[i].tolist() == pytest.approx(independent_logps(base, tok, pair(i)), abs=1e-4)
    # nothing of it is released: the checkpoint holds no reference
    assert not [p for p in Path(result.checkpoint).rglob("*") if p.suffix == ".f64"]

    # a later job from the same model on the same data reads it back ...
    def refuse(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr("dprc_core.training.runner.compute_reference", refuse)
    again = run_job(dpo_spec(tiny, pairs_file, tmp_path / "b", **kw))
    assert torch.equal(
        torch.cat([v.flatten() for v in weights(again.checkpoint).values()]),
        torch.cat([v.flatten() for v in weights(result.checkpoint).values()]),
    )
    # ... unless it was altered: then it is computed again, never used
    raw = bytearray(kept[0].read_bytes())
    raw[0] ^= 1
    kept[0].write_bytes(bytes(raw))
    with pytest.raises(AssertionError, match="computed again"):
        run_job(dpo_spec(tiny, pairs_file, tmp_path / "c", **kw))


def test_a_resumed_full_fine_tune_equals_the_uninterrupted_run(tiny, pairs_file, tmp_path):
    # little noise and nothing clipped: a wrong reference changes the update (clipping every
    # pair would normalise the sigmoid's factor away, and much noise would hide it)
    kw = dict(
        epochs=2.0,
        checkpoint_every=2,
        noise_multiplier=0.3,
        target_epsilon=None,
        max_grad_norm=1e3,
        learning_rate=0.05,
    )
    whole = run_job(dpo_spec(tiny, pairs_file, tmp_path / "whole", **kw))
    part = tmp_path / "part"
    calls = iter(range(100))
    stopped = run_job(dpo_spec(tiny, pairs_file, part, **kw), should_stop=lambda: next(calls) == 2)
    assert stopped.status == "stopped" and stopped.steps_done == 3
    # the kept reference is gone: the resume loads the starting model again for it (the
    # weights being trained are not the reference any more)
    for folder in (tmp_path / "stores").glob(f"*/{REFERENCE_DIR}"):
        shutil.rmtree(folder)
    resumed = run_job(dpo_spec(tiny, pairs_file, part, **kw))
    assert resumed.resumed_from == 3 and resumed.steps_done == whole.steps_done
    w1, w2 = weights(whole.checkpoint), weights(resumed.checkpoint)
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=0, atol=1e-6)
    assert resumed.epsilon == whole.epsilon


def test_user_level_dpo_and_nu_dpftrl_on_pairs(tiny, tmp_path):
    users = write(tmp_path / "users.jsonl", [pair(i, user=f"u{i % 6}") for i in range(24)])
    by_user = run_job(dpo_spec(tiny, users, tmp_path / "u", privacy_unit="user", batch_size=3))
    assert by_user.plan.unit == "user" and by_user.plan.dataset_size == 6
    assert by_user.epsilon <= 4.0
    plain = write(tmp_path / "plain.jsonl", [pair(i) for i in range(24)])
    nu = run_job(
        dpo_spec(tiny, plain, tmp_path / "nu", noise_mechanism="nu_dpftrl", nu=0.1, epochs=1)
    )
    assert nu.status == "succeeded" and nu.plan.mechanism == "nu_dpftrl"
    assert nu.epsilon <= 4.0


def test_the_method_and_the_file_must_agree(tiny, pairs_file, tmp_path):
    text = tmp_path / "text.jsonl"
    text.write_text("\n".join(json.dumps({"text": "ab" * 8}) for _ in range(8)) + "\n")
    with pytest.raises(DataError, match="method: dpo trains preference lines"):
        run_job(dpo_spec(tiny, text, tmp_path / "x"))
    with pytest.raises(DataError, match="they train with method: dpo"):
        run_job(dpo_spec(tiny, pairs_file, tmp_path / "y", method="supervised", beta=None))
    with pytest.raises(ValidationDataError, match="preference lines"):
        run_job(dpo_spec(tiny, pairs_file, tmp_path / "z", validation_file=str(text)))
    with pytest.raises(ValueError, match="beta is DPO's"):
        dpo_spec(tiny, pairs_file, tmp_path / "w", method="supervised")
    with pytest.raises(ValueError, match="beta must be"):
        dpo_spec(tiny, pairs_file, tmp_path / "w", beta=0)
    with pytest.raises(ValueError, match="causal LM"):
        dpo_spec(tiny, pairs_file, tmp_path / "w", task="classification")
    with pytest.raises(ValueError, match="method must be one of"):
        dpo_spec(tiny, pairs_file, tmp_path / "w", method="reinforcement")
