"""DPTrainer / DPSFTTrainer and what an experienced Trainer user expects (issue 33, point 6).

* per-epoch strategies: one eval / log / checkpoint per epoch of the plan (epoch e ends after
  ⌈e·N/B⌉ steps), exactly the planned steps in all, the logged epoch never above
  ``num_train_epochs``; a run resumed at an epoch boundary ends as an uninterrupted one;
* a second ``train()`` is refused with its reason (the engine's steps and ε unchanged);
* a bare ``SFTConfig``: every refusal at once, each naming its setting, before TRL tokenizes;
* the resume-mismatch error names only the plan fields that differ;
* DPSFTTrainer logs SFT's mean_token_accuracy / entropy / num_tokens, equal to the same
  metrics recomputed from the batches the engine saw; ``report_train_loss=False`` drops the
  training-set metrics;
* ``save_model`` (and checkpoints) write ``training_args.json``, never ``training_args.bin``.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction

import pytest
import torch
from transformers import TrainerCallback, default_data_collator

from dprc_core.integrations import DPTrainer, DPTrainerError, PrivacyArguments
from tests.conftest import trainable_named
from tests.dprc_core.integrations.test_hf_trainer import DATA, llama, lm_examples, targs


class Count(TrainerCallback):
    """Counts the evaluations and records the steps of the epoch ends and saves."""

    def __init__(self):
        self.evaluations: list[int] = []
        self.epoch_ends: list[int] = []
        self.saves: list[int] = []

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations.append(state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.epoch_ends.append(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.saves.append(state.global_step)


def ceil_steps(epochs, n, b):
    """The plan's step rule, written out: ⌈epochs·N/B⌉."""
    return math.ceil(Fraction(str(epochs)) * n / b)


def epoch_trainer(tmp_path, model, n, *, callbacks=(), privacy=None, **kw):
    args = targs(
        tmp_path,
        eval_strategy="epoch",
        logging_strategy="epoch",
        save_strategy="epoch",
        per_device_eval_batch_size=8,
        learning_rate=0.05,
        **kw,
    )
    return DPTrainer(
        model=model,
        args=args,
        train_dataset=lm_examples(n),
        eval_dataset=lm_examples(6, seed=9),
        data_collator=default_data_collator,
        callbacks=list(callbacks),
        privacy_args=privacy
        or PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=3),
    )


def test_epoch_strategies_fire_once_per_planned_epoch(tiny_llama_path, tmp_path):
    """4 epochs of N=24 at B=8: 12 steps, epochs end at 3, 6, 9, 12 — one eval, one log, one
    checkpoint at each; a run resumed from the epoch-2 checkpoint ends with the same weights."""
    count = Count()
    trainer = epoch_trainer(
        tmp_path / "full", llama(tiny_llama_path), 24, callbacks=[count], num_train_epochs=4
    )
    out = trainer.train()
    assert trainer.plan.steps == ceil_steps(4, 24, 8) == 12
    assert out.global_step == trainer.engine.steps == 12
    assert count.epoch_ends == count.evaluations == count.saves == [3, 6, 9, 12]
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == [3, 6, 9, 12]
    assert [h["epoch"] for h in logged] == [1.0, 2.0, 3.0, 4.0]
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["epoch"] for h in evals] == [1.0, 2.0, 3.0, 4.0]
    assert all(h["epoch"] <= 4 for h in trainer.state.log_history)
    assert out.metrics["epsilon"] == trainer.epsilon_at(12)
    checkpoints = tmp_path / "full" / "out"
    assert {p.name for p in checkpoints.glob("checkpoint-*")} == {
        f"checkpoint-{s}" for s in (3, 6, 9, 12)
    }
    for ckpt in checkpoints.glob("checkpoint-*"):  # the arguments as JSON, never a pickle
        assert not (ckpt / "training_args.bin").exists()
        assert json.loads((ckpt / "training_args.json").read_text())["max_steps"] == 12

    resumed_count = Count()
    resumed = epoch_trainer(
        tmp_path / "resumed",
        llama(tiny_llama_path),
        24,
        callbacks=[resumed_count],
        num_train_epochs=4,
        privacy=PrivacyArguments(noise_multiplier=1.0, norm_method="exact"),  # seed: restored
    )
    resumed_out = resumed.train(resume_from_checkpoint=str(checkpoints / "checkpoint-6"))
    assert resumed_out.global_step == resumed.engine.steps == 12
    assert resumed_count.evaluations == [9, 12]  # the remaining epochs, one eval each
    a, b = trainable_named(trainer.model), trainable_named(resumed.model)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0)
    assert resumed_out.metrics["epsilon"] == out.metrics["epsilon"]


@pytest.mark.parametrize(
    ("n", "kw", "ends", "epochs"),
    [
        # B does not divide N: epochs end where the plan of 1, 2 epochs ends (⌈2.5⌉, ⌈5⌉)
        (20, {"num_train_epochs": 2}, [3, 5], [1.0, 2.0]),
        # the report: 1 epoch of 30 at B=8 logged epoch 1.067; now 1.0
        (30, {"num_train_epochs": 1}, [4], [1.0]),
        # a fractional last epoch: never logged above num_train_epochs
        (24, {"num_train_epochs": 1.5}, [3, 5], [1.0, 1.5]),
        # max_steps: the plan's epochs of 3 steps, the last cut at the fifth step
        (24, {"max_steps": 5}, [3, 5], [1.0, 5 / 3]),
    ],
)
def test_epoch_boundaries_as_the_plan_counts_them(tiny_llama_path, tmp_path, n, kw, ends, epochs):
    count = Count()
    trainer = epoch_trainer(tmp_path, llama(tiny_llama_path), n, callbacks=[count], **kw)
    out = trainer.train()
    want = kw.get("max_steps") or ceil_steps(kw["num_train_epochs"], n, 8)
    assert trainer.plan.steps == want == out.global_step == trainer.engine.steps == ends[-1]
    assert count.epoch_ends == count.evaluations == count.saves == ends
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == ends
    assert [h["epoch"] for h in logged] == pytest.approx(epochs, rel=1e-12)
    cap = kw.get("num_train_epochs", math.inf)
    assert all(h["epoch"] <= cap for h in trainer.state.log_history)


def test_a_second_train_is_refused_and_spends_nothing(tiny_llama_path, tmp_path):
    trainer = DPTrainer(
        model=llama(tiny_llama_path),
        args=targs(tmp_path, max_steps=2),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=0),
    )
    out = trainer.train()
    weights = {k: v.detach().clone() for k, v in trainable_named(trainer.model).items()}
    with pytest.raises(DPTrainerError) as err:
        trainer.train()
    message = str(err.value)
    assert "trained already" in message and "2 of the 2 planned steps" in message
    assert "resume_from_checkpoint" in message and "composition" in message
    assert trainer.engine.steps == 2  # no step ran
    assert trainer.epsilon_at(trainer.engine.steps) == out.metrics["epsilon"]
    for name, value in trainable_named(trainer.model).items():
        assert torch.equal(value.detach(), weights[name])
    with pytest.raises(DPTrainerError, match="trained already"):
        trainer.train(resume_from_checkpoint=None)


def test_no_args_is_refused_before_the_trainer_is_built(tiny_llama_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the Trainer's default output_dir would be made here
    with pytest.raises(DPTrainerError, match=r"no args: .*max_grad_norm=0"):
        DPTrainer(
            model=llama(tiny_llama_path),
            train_dataset=lm_examples(),
            privacy_args=PrivacyArguments(target_epsilon=8.0),
        )
    assert not any(tmp_path.iterdir())


def test_every_refusal_at_once_each_naming_its_setting(tiny_llama_path, tmp_path):
    with pytest.raises(DPTrainerError) as err:
        DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(
                tmp_path,
                max_steps=2,
                max_grad_norm=1.0,
                gradient_checkpointing=True,
                dataloader_drop_last=True,
                label_smoothing_factor=0.1,
            ),
            train_dataset=lm_examples(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(target_epsilon=8.0),
        )
    lines = [x for x in str(err.value).splitlines() if x.startswith("- ")]
    assert len(lines) == 4, str(err.value)
    for fix in (
        "set max_grad_norm=0",
        "set gradient_checkpointing=False",
        "set dataloader_drop_last=False",
        "set label_smoothing_factor=0",
    ):
        assert sum(fix in line for line in lines) == 1, (fix, lines)


def test_a_resume_mismatch_names_only_the_fields_that_differ(tiny_llama_path, tmp_path):
    def trainer(out, sigma, seed=None):
        return DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(out, max_steps=4, save_strategy="steps", save_steps=2),
            train_dataset=lm_examples(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(
                noise_multiplier=sigma, norm_method="exact", dp_seed=seed
            ),
        )

    first = trainer(tmp_path / "a", 0.7, seed=1)
    first.train()
    second = trainer(tmp_path / "b", 0.9)
    saved, now = first.plan.to_dict(), second.plan.to_dict()
    differ = {k for k in saved if saved[k] != now[k]}
    assert differ and len(differ) < len(saved) // 2
    with pytest.raises(DPTrainerError, match="another privacy plan") as err:
        second.train(resume_from_checkpoint=str(tmp_path / "a" / "out" / "checkpoint-2"))
    lines = [x for x in str(err.value).splitlines() if x.startswith("- ")]
    named = {re.match(r"- (\w+): ", x).group(1) for x in lines}
    assert named == differ
    for name in differ:
        line = next(x for x in lines if x.startswith(f"- {name}: "))
        assert f"{saved[name]!r} in the checkpoint, {now[name]!r} now" in line
    for name in set(saved) - differ:  # no full plan dump
        assert f"'{name}'" not in str(err.value) and f"- {name}:" not in str(err.value)


def test_save_model_writes_the_arguments_as_json_not_a_pickle(tiny_llama_path, tmp_path):
    args = targs(tmp_path, max_steps=2)
    trainer = DPTrainer(
        model=llama(tiny_llama_path),
        args=args,
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=0),
    )
    trainer.train()
    saved = tmp_path / "saved"
    trainer.save_model(str(saved))
    files = {p.name for p in saved.iterdir()}
    assert "training_args.bin" not in files
    assert not {f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl"))}
    written = json.loads((saved / "training_args.json").read_text())
    assert written["max_grad_norm"] == 0.0 and written["max_steps"] == 2
    assert written["per_device_train_batch_size"] == args.per_device_train_batch_size
    assert {"model.safetensors", "privacy_ledger.json", "privacy.json"} <= files


# --------------------------------------------------------------------------- TRL
@pytest.fixture(scope="module")
def sft_setup(tmp_path_factory):
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from dprc_core.training.tiny import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("sft") / "tiny", hidden=32, layers=1)
    tok = AutoTokenizer.from_pretrained(path)
    texts = [json.loads(x)["text"] for x in (DATA / "reviews_train.jsonl").read_text().splitlines()]
    return (
        path,
        tok,
        Dataset.from_dict({"text": texts[:24]}),
        Dataset.from_dict({"text": texts[24:30]}),
    )


def sft_config(tmp_path, **kw):
    from trl import SFTConfig

    base = dict(
        output_dir=str(tmp_path / "sft"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=3,
        max_grad_norm=0.0,
        gradient_checkpointing=False,
        max_length=32,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    base.update(kw)
    return SFTConfig(**base)


def test_a_bare_sft_config_lists_every_refusal_before_tokenizing(sft_setup, tmp_path, monkeypatch):
    from trl import SFTConfig, SFTTrainer

    from dprc_core.integrations import DPSFTTrainer

    path, tok, train, _ = sft_setup
    prepared: list[str] = []
    monkeypatch.setattr(
        SFTTrainer, "_prepare_dataset", lambda self, *a, **k: prepared.append("called")
    )
    privacy = PrivacyArguments(target_epsilon=8.0)
    bare = SFTConfig(output_dir=str(tmp_path / "bare"), use_cpu=True, report_to=[])
    with pytest.raises(DPTrainerError) as err:
        DPSFTTrainer(
            model=llama(path),
            args=bare,
            train_dataset=train,
            processing_class=tok,
            privacy_args=privacy,
        )
    message = str(err.value)
    lines = [x for x in message.splitlines() if x.startswith("- ")]
    assert len(lines) == 2, message  # SFTConfig's max_grad_norm=1.0 and gradient checkpointing
    assert "set max_grad_norm=0" in message and "set gradient_checkpointing=False" in message
    assert prepared == []  # refused before TRL tokenized anything

    more = SFTConfig(
        output_dir=str(tmp_path / "more"),
        use_cpu=True,
        report_to=[],
        packing=True,
        loss_type="dft",
        dataloader_drop_last=True,
    )
    with pytest.raises(DPTrainerError) as err:
        DPSFTTrainer(
            model=llama(path),
            args=more,
            train_dataset=train,
            processing_class=tok,
            privacy_args=privacy,
        )
    lines = [x for x in str(err.value).splitlines() if x.startswith("- ")]
    fixes = (
        "set max_grad_norm=0",
        "set gradient_checkpointing=False",
        "set packing=False",
        "set loss_type='nll'",
        "set dataloader_drop_last=False",
    )
    assert len(lines) == len(fixes), lines
    for fix in fixes:
        assert sum(fix in line for line in lines) == 1, (fix, lines)
    with pytest.raises(DPTrainerError, match=r"no args: .*gradient_checkpointing=False"):
        DPSFTTrainer(
            model=llama(path), train_dataset=train, processing_class=tok, privacy_args=privacy
        )
    assert prepared == []


def _sft_metrics_reference(model, micro_batches):
    """SFT's definitions, recomputed: over next-token positions with a label, the share whose
    label is the arg max of the logits, and the mean entropy; tokens: Σ attention_mask."""
    valid = correct = 0
    entropy = 0.0
    tokens = 0
    with torch.no_grad():
        for batch in micro_batches:
            tokens += int(batch["attention_mask"].sum())
            if batch["input_ids"].shape[0] == 0:
                continue
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
            logits, labels = logits[:, :-1].double(), batch["labels"][:, 1:]
            keep = labels != -100
            valid += int(keep.sum())
            correct += int(((logits.argmax(-1) == labels) & keep).sum())
            entropy += float(torch.special.entr(torch.softmax(logits, -1)).sum(-1)[keep].sum())
    return correct / valid, entropy / valid, tokens


@pytest.mark.parametrize("report", [True, False])
def test_dp_sft_logs_sft_token_metrics(sft_setup, tmp_path, report):
    """learning rate 0: the model stays as loaded, so each step's metrics can be recomputed from
    the micro-batches the engine was given."""
    from dprc_core import PrivacyEngine
    from dprc_core.integrations import DPSFTTrainer

    path, tok, train, valid = sft_setup
    model = llama(path)
    reference = llama(path)
    seen: list[dict] = []
    accumulate = PrivacyEngine.accumulate

    def spy(self, loss_fn, batch, example_ids=None):
        seen.append({k: v.detach().clone() for k, v in batch.items() if torch.is_tensor(v)})
        return accumulate(self, loss_fn, batch, example_ids)

    trainer = DPSFTTrainer(
        model=model,
        args=sft_config(
            tmp_path, learning_rate=0.0, optim="sgd", eval_strategy="steps", eval_steps=3
        ),
        train_dataset=train,
        eval_dataset=valid,
        processing_class=tok,
        privacy_args=PrivacyArguments(
            noise_multiplier=1.0, norm_method="exact", dp_seed=4, report_train_loss=report
        ),
    )
    PrivacyEngine.accumulate = spy
    try:
        trainer.train()
    finally:
        PrivacyEngine.accumulate = accumulate
    train_logs = [
        h for h in trainer.state.log_history if not {"eval_loss", "train_runtime"} & set(h)
    ]
    eval_logs = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(train_logs) == 3 and len(eval_logs) == 1
    assert "eval_mean_token_accuracy" in eval_logs[0] and "eval_entropy" in eval_logs[0]
    if not report:  # computed on the private training data: left out
        for h in trainer.state.log_history:
            assert not {"loss", "train_loss", "mean_token_accuracy", "entropy", "num_tokens"} & set(
                h
            ), h
            assert "eval_num_tokens" not in h
        return
    assert len(seen) == 6  # 3 steps of 2 micro-batches
    total = 0
    for step, h in enumerate(train_logs):
        acc, ent, tokens = _sft_metrics_reference(reference, seen[2 * step : 2 * step + 2])
        total += tokens
        assert h["num_tokens"] == total > 0
        if tokens:
            assert h["mean_token_accuracy"] == pytest.approx(acc, rel=1e-5, abs=1e-7)
            assert h["entropy"] == pytest.approx(ent, rel=1e-4)
            assert 0 <= h["mean_token_accuracy"] <= 1
    assert eval_logs[0]["eval_num_tokens"] == total > 0
