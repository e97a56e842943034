"""DPTrainer (transformers.Trainer with dprc's DP steps), checked against independent references.

* one Trainer step with σ = 0 and exact norms equals the clipped update built from torch.func
  per-sample gradients of the examples the data loader actually fetched (tiny Llama full and
  LoRA in both orders of get_peft_model / .to(), MiniLM classifier LoRA and full);
* ε in the logs equals Google dp_accounting's for the steps run;
* a run resumed from a Trainer checkpoint ends with the same weights (rtol = 0) and ε;
* LoRA parameters replaced after the optimizer was built (Opacus #820) raise;
* the settings that would break privacy are refused with their reason.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as dpl
from transformers import (
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    HfArgumentParser,
    LlamaForCausalLM,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from dprc_core.accounting import PrivacyLedger, epsilon_for_events
from dprc_core.engine import PrivacyWarning
from dprc_core.integrations import DPTrainer, DPTrainerError, PrivacyArguments
from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from tests.conftest import grad_norms, minilm_path, torch_func_per_sample_grads, trainable_named

DATA = Path(__file__).resolve().parents[3] / "data" / "demo"
N_LM = 24


class RecordingDataset(torch.utils.data.Dataset):
    """A list of examples that records which indices each fetched batch held."""

    def __init__(self, examples):
        self.examples = examples
        self.fetched: list[list[int]] = []

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]

    def __getitems__(self, indices):
        self.fetched.append(list(indices))
        return [self.examples[i] for i in indices]


def lm_examples(n=N_LM, length=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, 64, (length,), generator=g)
        labels = ids.clone()
        labels[:3] = -100  # a prompt: ignored by the loss
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def targs(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_grad_norm=0.0,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    base.update(kw)
    return TrainingArguments(**base)


def llama(path):
    return LlamaForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False)


def lora(model):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(model, cfg)
    torch.manual_seed(3)
    with torch.no_grad():  # lora_B starts at zero; randomise so that lora_A's gradient is not 0
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model


def minilm(full: bool):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(2)
    model = AutoModelForSequenceClassification.from_pretrained(
        minilm_path(),
        num_labels=2,
        use_safetensors=True,
        trust_remote_code=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    if full:
        model.bert.embeddings.requires_grad_(False)  # keep the reference's memory small
        return model.double()
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value"], task_type="SEQ_CLS", lora_dropout=0.0
    )
    return get_peft_model(model, cfg).double()


def review_examples(tokenizer, n=16):
    lines = (DATA / "reviews_train.jsonl").read_text().splitlines()[:n]
    out = []
    for line in lines:
        row = json.loads(line)
        enc = tokenizer(row["text"], truncation=True, max_length=16)
        out.append({**enc, "label": int(row["label"] == "positive")})
    return out


def build_case(case, tiny_llama_path):
    """(model, examples, collator, per-sample loss) of a test case."""
    if case == "llama_full":
        return llama(tiny_llama_path).double(), lm_examples(), default_data_collator, "lm"
    if case == "llama_lora_then_to":
        return lora(llama(tiny_llama_path)).double(), lm_examples(), default_data_collator, "lm"
    if case == "llama_to_then_lora":
        return lora(llama(tiny_llama_path).double()), lm_examples(), default_data_collator, "lm"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path())
    model = minilm(full=case == "minilm_full")
    return model, review_examples(tok), DataCollatorWithPadding(tok), "cls"


def quiet_sigma0():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore", PrivacyWarning)
    return ctx


@pytest.mark.parametrize(
    "case",
    [
        "llama_full",
        "llama_lora_then_to",
        "llama_to_then_lora",
        "minilm_lora",
        pytest.param("minilm_full", marks=pytest.mark.slow),  # per-sample grads of 10M params
    ],
)
def test_one_trainer_step_equals_the_reference_clipped_update(case, tiny_llama_path, tmp_path):
    model, examples, collate, kind = build_case(case, tiny_llama_path)
    loss_fn = causal_lm_per_sample_loss if kind == "lm" else sequence_classification_per_sample_loss
    reference = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in trainable_named(model).items()}
    # C: the median per-sample norm of a few examples, so that some samples are clipped
    probe = {
        k: v.double() if v.is_floating_point() else v for k, v in collate(examples[:6]).items()
    }
    c = float(grad_norms(torch_func_per_sample_grads(reference, loss_fn, dict(probe))).median())
    data = RecordingDataset(examples)
    lr = 0.5
    ctx = quiet_sigma0()
    try:
        trainer = DPTrainer(
            model=model,
            args=targs(tmp_path, max_steps=1, learning_rate=lr),
            train_dataset=data,
            data_collator=collate,
            privacy_args=PrivacyArguments(
                noise_multiplier=0.0, norm_method="exact", per_sample_max_grad_norm=c, dp_seed=5
            ),
        )
        trainer.train()
    finally:
        ctx.__exit__(None, None, None)
    assert trainer.plan.steps == 1 and trainer.engine is not None and trainer.engine.steps == 1
    fetched = sorted(i for chunk in data.fetched for i in chunk)
    assert len(data.fetched) == 2 and fetched, data.fetched  # 2 micro-batches of one batch
    batch = dict(collate([examples[i] for i in fetched]))
    per_sample = torch_func_per_sample_grads(reference, loss_fn, batch)
    norms = grad_norms(per_sample)
    factor = (c / norms).clamp(max=1.0)
    expected_b = 4 * 2  # per_device_train_batch_size · gradient_accumulation_steps = q·N
    after = trainable_named(model)
    for name, g in per_sample.items():
        clipped_sum = (g * factor.reshape(-1, *([1] * (g.dim() - 1)))).sum(0)
        want = before[name] - lr * clipped_sum / expected_b
        torch.testing.assert_close(after[name].detach(), want, rtol=1e-7, atol=1e-10)
    assert any(not torch.equal(after[n].detach(), before[n]) for n in before)


def _dp_accounting_epsilon(sigma, q, steps, delta):
    pld = dpl.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-4, pessimistic_estimate=True
    )
    return pld.self_compose(steps).get_epsilon_for_delta(delta)


def test_epsilon_in_every_log_equals_dp_accounting(tiny_llama_path, tmp_path):
    n = N_LM
    trainer = DPTrainer(
        model=llama(tiny_llama_path),
        args=targs(tmp_path, num_train_epochs=1.0, learning_rate=0.01),
        train_dataset=lm_examples(n),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=1),
    )
    out = trainer.train()
    # the one step rule: ceil(epochs · N / B) with B = 4 · 2
    assert trainer.plan.steps == math.ceil(1.0 * n / 8) == out.global_step
    exact = n**-1.1  # δ: 1/N^1.1 rounded down to two significant digits
    e = math.floor(math.log10(exact))
    delta = math.floor(exact / 10**e * 10) / 10 * 10**e
    assert trainer.plan.delta == pytest.approx(delta, rel=1e-12)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == list(range(1, out.global_step + 1))
    for h in logged:
        ref = _dp_accounting_epsilon(1.0, 8 / n, h["step"], delta)
        assert -0.005 * ref <= h["epsilon"] - ref <= 0.01 * ref, (h, ref)
    ref = _dp_accounting_epsilon(1.0, 8 / n, out.global_step, delta)
    assert -0.005 * ref <= out.metrics["epsilon"] - ref <= 0.01 * ref


def test_save_model_writes_safetensors_and_the_ledger(tiny_llama_path, tmp_path):
    trainer = DPTrainer(
        model=lora(llama(tiny_llama_path)),
        args=targs(tmp_path, max_steps=2),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(target_epsilon=8.0, norm_method="exact", dp_seed=2),
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    files = {p.name for p in (tmp_path / "saved").iterdir()}
    assert "adapter_model.safetensors" in files
    assert not files & {"adapter_model.bin", "pytorch_model.bin"}  # weights never pickled
    ledger = PrivacyLedger.from_json((tmp_path / "saved" / "privacy_ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == 2
    assert ledger.epsilon(trainer.plan.delta) == pytest.approx(trainer.epsilon_at(2), rel=1e-12)
    assert "dprc_private" not in files


def test_a_resumed_run_ends_with_the_same_weights_and_epsilon(tiny_llama_path, tmp_path):
    def run(out, resume=None):
        trainer = DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(
                out,
                max_steps=4,
                optim="adamw_torch",
                lr_scheduler_type="linear",
                learning_rate=0.01,
                save_strategy="steps",
                save_steps=2,
                logging_steps=2,
            ),
            train_dataset=lm_examples(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(noise_multiplier=0.7, norm_method="hutch", k=32),
        )
        result = trainer.train(resume_from_checkpoint=resume)
        return trainer, result

    full, full_out = run(tmp_path / "a")  # a fresh secret seed
    ckpt = tmp_path / "a" / "out" / "checkpoint-2"
    assert (ckpt / "dprc_private" / "engine.safetensors").is_file()
    assert oct((ckpt / "dprc_private").stat().st_mode & 0o777) == "0o700"
    # another fresh seed: the resumed run must take the checkpoint's, not its own
    resumed, resumed_out = run(tmp_path / "b", resume=str(ckpt))
    assert resumed.state.global_step == full.state.global_step == 4
    a, b = trainable_named(full.model), trainable_named(resumed.model)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0)
    assert resumed_out.metrics["epsilon"] == full_out.metrics["epsilon"] == full.epsilon_at(4)


def test_a_checkpoint_planned_before_the_scale_law_resumes_on_the_legacy_law(
    tiny_llama_path, tmp_path
):
    """A per-example checkpoint whose plan has no ``scale_width`` (written before the law was
    recorded) was planned on the 0.1 % law: resuming on today's 1 % law is another plan,
    refused naming the law; with ``scale_width=0.001`` it resumes, and its ε is that law's."""

    def trainer(out, **privacy):
        return DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(out, max_steps=4, save_strategy="steps", save_steps=2),
            train_dataset=lm_examples(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(noise_multiplier=0.7, norm_method="hutch", **privacy),
        )

    first = trainer(tmp_path / "a")
    assert first.plan.sketch == "per_example" and first.plan.scale_width == 0.01
    first.train()
    ckpt = tmp_path / "a" / "out" / "checkpoint-2"
    state_file = ckpt / "dprc_private" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["plan"]["scale_width"] == 0.01
    del state["plan"]["scale_width"]
    # and its planned ε as that code computed it: on the legacy law
    legacy_event = dataclasses.replace(first.plan.event(), scale_width=0.001)
    state["plan"]["planned_epsilon"] = epsilon_for_events([legacy_event], first.plan.delta)
    state_file.write_text(json.dumps(state))
    with pytest.raises(DPTrainerError, match=r"scale_width: 0\.001 in the checkpoint, 0\.01 now"):
        trainer(tmp_path / "b").train(resume_from_checkpoint=str(ckpt))
    legacy = trainer(tmp_path / "c", scale_width=0.001)
    out = legacy.train(resume_from_checkpoint=str(ckpt))
    assert legacy.plan.scale_width == 0.001 and legacy.state.global_step == 4
    event = legacy.plan.event(4)
    assert event.scale_width == 0.001
    assert out.metrics["epsilon"] == pytest.approx(
        PrivacyLedger([event]).epsilon(legacy.plan.delta)
    )
    assert out.metrics["epsilon"] < first.epsilon_at(4)  # the finer law's ε is below 1 %'s


def test_lora_parameters_replaced_after_the_optimizer_raise(tiny_llama_path, tmp_path):
    """Opacus #820: the optimizer steps tensors the model no longer uses, so the weights never
    move while loss and ε look normal. Here the LoRA parameters are replaced once the optimizer
    exists (load_state_dict(assign=True)); the engine's update check must raise."""

    class ReplaceParameters(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
            model.load_state_dict(sd, assign=True)

    model = lora(llama(tiny_llama_path))
    trainer = DPTrainer(
        model=model,
        args=targs(tmp_path, max_steps=2),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        callbacks=[ReplaceParameters()],
        privacy_args=PrivacyArguments(noise_multiplier=1.0, dp_seed=0),
    )
    with pytest.raises(RuntimeError, match="no trainable parameter of the model changed.*replaced"):
        trainer.train()


def test_training_stops_before_exceeding_max_epsilon(tiny_llama_path, tmp_path):
    probe = DPTrainer(
        model=llama(tiny_llama_path),
        args=targs(tmp_path, max_steps=6),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=0),
    )
    cap = (probe.epsilon_at(3) + probe.epsilon_at(4)) / 2
    trainer = DPTrainer(
        model=llama(tiny_llama_path),
        args=targs(tmp_path, max_steps=6),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(
            noise_multiplier=1.0, norm_method="exact", dp_seed=0, max_epsilon=cap
        ),
    )
    out = trainer.train()
    assert out.global_step == 3 and trainer.engine.steps == 3
    assert out.metrics["epsilon"] <= cap
    assert trainer.stop_reason is not None and "max_epsilon" in trainer.stop_reason


class OwnSampler(DPTrainer):
    def _get_train_sampler(self, train_dataset=None):
        return torch.utils.data.SequentialSampler(self.train_dataset)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(lm_examples())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"max_grad_norm": 1.0}, "max_grad_norm=1.0: the Trainer's global clipping"),
        ({"train_sampling_strategy": "group_by_length"}, "group_by_length: batches"),
        ({"train_sampling_strategy": "sequential"}, "train_sampling_strategy='sequential'"),
        ({"gradient_checkpointing": True}, "checkpointing"),
        ({"auto_find_batch_size": True}, "auto_find_batch_size"),
        ({"dataloader_drop_last": True}, "dataloader_drop_last"),
        ({"ignore_data_skip": True}, "ignore_data_skip"),
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor"),
        ({"trainer": OwnSampler}, "overrides _get_train_sampler"),
        ({"collator": DataCollatorWithFlattening()}, "flattens examples into one row"),
        ({"dataset": Stream()}, "iterable"),
    ],
)
def test_privacy_breaking_settings_are_refused(change, reason, tiny_llama_path, tmp_path):
    change = dict(change)
    cls = change.pop("trainer", DPTrainer)
    collator = change.pop("collator", default_data_collator)
    dataset = change.pop("dataset", lm_examples())
    with pytest.raises(DPTrainerError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        cls(
            model=llama(tiny_llama_path),
            args=targs(tmp_path, max_steps=2, **change),
            train_dataset=dataset,
            data_collator=collator,
            privacy_args=PrivacyArguments(target_epsilon=8.0),
        )


def test_a_collator_that_changes_the_examples_is_refused(tiny_llama_path, tmp_path):
    def first_row_only(examples):
        return {k: v[:1] for k, v in default_data_collator(examples).items()}

    trainer = DPTrainer(
        model=llama(tiny_llama_path),
        args=targs(tmp_path, max_steps=2),
        train_dataset=lm_examples(),
        data_collator=first_row_only,
        privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=0),
    )
    with pytest.raises(DPTrainerError, match="examples into a batch of 1 rows"):
        trainer.train()


def test_a_model_without_a_known_per_sample_loss_needs_one(tiny_llama_path, tmp_path):
    from transformers import LlamaModel

    with pytest.raises(DPTrainerError, match="per_sample_loss"):
        DPTrainer(
            model=LlamaModel.from_pretrained(tiny_llama_path, use_safetensors=True),
            args=targs(tmp_path, max_steps=2),
            train_dataset=lm_examples(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(target_epsilon=8.0),
        )


def test_privacy_arguments_parse_with_hf_argument_parser():
    parser = HfArgumentParser((TrainingArguments, PrivacyArguments))
    train, privacy = parser.parse_args_into_dataclasses(
        [
            "--output_dir=/tmp/x",
            "--per_sample_max_grad_norm=0.5",
            "--target_epsilon=3",
            "--norm_method=exact",
            "--k=8",
            "--noise_mechanism=gaussian",
        ]
    )
    assert privacy == PrivacyArguments(
        per_sample_max_grad_norm=0.5, target_epsilon=3.0, norm_method="exact", k=8
    )
    assert privacy.target_delta is None and privacy.noise_multiplier is None
    with pytest.raises(ValueError, match="exactly one of target_epsilon"):
        parser.parse_args_into_dataclasses(
            ["--output_dir=/tmp/x", "--noise_multiplier=1"] * 1 + ["--target_epsilon=3"]
        )
    with pytest.raises(ValueError, match="exactly one of target_epsilon"):
        PrivacyArguments()
    with pytest.raises(ValueError, match="norm_method"):
        PrivacyArguments(target_epsilon=1.0, norm_method="nope")


def test_dp_sft_trainer_trains_and_refuses_packing(tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig

    from dprc_core.integrations import DPSFTTrainer
    from dprc_core.training.tiny import build_tiny_llama

    path = build_tiny_llama(tmp_path / "tiny", hidden=32, layers=1)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    texts = [json.loads(x)["text"] for x in (DATA / "reviews_train.jsonl").read_text().splitlines()]
    dataset = Dataset.from_dict({"text": texts[:24]})

    def config(**kw):
        return SFTConfig(
            output_dir=str(tmp_path / "sft"),
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            max_steps=2,
            max_grad_norm=0.0,
            max_length=32,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            gradient_checkpointing=False,  # SFTConfig's default; refused by DPTrainer
            **kw,
        )

    privacy = PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=0)
    model = llama(path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPSFTTrainer(
        model=model,
        args=config(),
        train_dataset=dataset,
        processing_class=tok,
        privacy_args=privacy,
    )
    out = trainer.train()
    assert out.global_step == 2 and trainer.engine.steps == 2
    assert out.metrics["epsilon"] == trainer.epsilon_at(2) > 0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    for bad in ({"packing": True}, {"padding_free": True}):
        with pytest.raises(DPTrainerError, match="unit of privacy"):
            DPSFTTrainer(
                model=llama(path),
                args=config(**bad),
                train_dataset=dataset,
                processing_class=tok,
                privacy_args=privacy,
            )


def test_bf16_autocast_as_the_trainer_sets_it(tiny_llama_path, tmp_path):
    """``bf16=True``: the Trainer's autocast reaches the engine's passes (the layers compute in
    bfloat16), the weights stay float32 and move, ε is logged."""
    model = llama(tiny_llama_path)
    seen: set[torch.dtype] = set()
    proj = model.model.layers[0].self_attn.q_proj
    handle = proj.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
    before = {k: v.detach().clone() for k, v in trainable_named(model).items()}
    trainer = DPTrainer(
        model=model,
        args=targs(tmp_path, max_steps=2, bf16=True, learning_rate=0.01),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="hutch", dp_seed=4),
    )
    out = trainer.train()
    handle.remove()
    assert torch.bfloat16 in seen  # autocast was on in the passes the engine ran
    after = trainable_named(trainer.model)
    assert all(p.dtype == torch.float32 for p in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in before)
    assert math.isfinite(out.metrics["epsilon"]) and out.metrics["epsilon"] > 0


def test_per_example_sketches_through_the_trainer(tiny_llama_path, tmp_path):
    """sketch='per_example': the plan and the saved ledger use the hidden-scale model, whose
    σ for the target is the library's calibration (below the shared sketch's)."""
    from dprc_core.accounting import noise_multiplier

    privacy = PrivacyArguments(target_epsilon=8.0, norm_method="hutch", sketch="per_example")
    trainer = DPTrainer(
        model=lora(llama(tiny_llama_path)),
        args=targs(tmp_path, max_steps=2),
        train_dataset=lm_examples(),
        data_collator=default_data_collator,
        privacy_args=privacy,
    )
    trainer.train()
    plan = trainer.plan
    assert plan.sketch == "per_example" and trainer.engine.accounting_sketch == "per_example"
    want = noise_multiplier(8.0, plan.delta, plan.sample_rate, plan.steps, "hutch", 32)
    assert plan.noise_multiplier == noise_multiplier(
        8.0, plan.delta, plan.sample_rate, plan.steps, "hutch", 32, sketch="per_example"
    )
    assert plan.noise_multiplier < want
    trainer.save_model(str(tmp_path / "saved"))
    ledger = PrivacyLedger.from_json((tmp_path / "saved" / "privacy_ledger.json").read_text())
    assert {e.sketch for e in ledger.events} == {"per_example"}
    with pytest.raises(ValueError, match="randomized norm method"):
        PrivacyArguments(target_epsilon=8.0, norm_method="exact", sketch="per_example")


def test_per_example_sketches_are_keyed_by_the_data_set_index(tiny_llama_path, tmp_path):
    """The default for hutch is per-example sketches; DPTrainer hands the engine each row's
    index in the training set (the Poisson sampler's indices), so a micro-batch split changes
    no example's projection: 1 and 2 gradient-accumulation steps take the same update."""
    from dprc_core import PrivacyEngine
    from dprc_core.seeding import derive_seed
    from dprc_core.training.sampling import PoissonSampler

    recorded: list[list[int]] = []
    accumulate = PrivacyEngine.accumulate

    def spy(self, loss_fn, batch, example_ids=None):
        recorded.append([] if example_ids is None else example_ids.tolist())
        return accumulate(self, loss_fn, batch, example_ids)

    weights = []
    for micro in (1, 2):
        recorded.clear()
        privacy = PrivacyArguments(target_epsilon=8.0, norm_method="hutch", dp_seed=5)
        torch.manual_seed(0)  # the same LoRA initialisation
        model = lora(llama(tiny_llama_path))
        trainer = DPTrainer(
            model=model,
            args=targs(
                tmp_path / str(micro),
                max_steps=2,
                per_device_train_batch_size=8 // micro,  # the same expected batch, 8
                gradient_accumulation_steps=micro,
            ),
            train_dataset=lm_examples(),
            data_collator=default_data_collator,
            privacy_args=privacy,
        )
        PrivacyEngine.accumulate = spy
        try:
            trainer.train()
        finally:
            PrivacyEngine.accumulate = accumulate
        assert trainer.plan.sketch == "per_example"  # the default
        # each step's Poisson batch is drawn from its own seed (derived from the DP seed)
        want = [
            next(
                iter(
                    PoissonSampler(
                        len(lm_examples()),
                        trainer.plan.sample_rate,
                        1,
                        seed=derive_seed(trainer.dp_seed, "sampler-step", step),
                    )
                )
            ).tolist()
            for step in range(trainer.plan.steps)
        ]
        got = [sum(recorded[i : i + micro], []) for i in range(0, len(recorded), micro)]
        assert got == want
        weights.append({k: v.detach().clone() for k, v in trainable_named(trainer.model).items()})
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=1e-5, atol=1e-6)
