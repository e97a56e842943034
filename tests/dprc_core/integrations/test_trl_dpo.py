"""DPDPOTrainer (TRL's DPOTrainer with dprc's DP steps, one preference pair one privacy unit),
checked against TRL 1.16's own DPOTrainer code, on a tiny char-level Llama.

* σ = 0, exact norms, float64: one step's update is Σ over the Poisson-sampled pairs (the
  engine's example ids) of min(1, C/‖g_p‖)·g_p / B, with g_p the torch.func gradient of TRL's
  ``DPOTrainer.compute_loss`` on the pair alone (TRL's collator on the data set's rows; both
  sequences in one gradient; TRL's fused float32 LM head replaced by the exact float64 log-softmax
  so that the comparison can be to 1e-9), C such that some pairs clip;
* the per-pair loss trained equals TRL's ``compute_loss`` (its real fused head) on each pair, and
  the logged reward metrics equal the ones TRL's ``_compute_loss`` records for the same batch;
* the refusals, all at once, before TRL tokenizes;
* ε in the logs; a short DP run on a toy preference task raises TRL's eval reward accuracy;
* LoRA from ``peft_config``: no reference model kept, the precomputed reference is the model with
  its adapters disabled (``dprc_core.preference.reference_logps``), only the adapters move.
"""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402
from trl.trainer.dpo_trainer import DataCollatorForPreference  # noqa: E402

from dprc_core import PrivacyEngine  # noqa: E402
from dprc_core.engine import PrivacyWarning  # noqa: E402
from dprc_core.integrations import DPDPOTrainer, DPTrainerError, PrivacyArguments  # noqa: E402
from dprc_core.integrations.trl_dpo import pairs_from_trl  # noqa: E402
from tests.conftest import trainable_named  # noqa: E402

BETA = 0.5
ROWS = ("input_ids", "attention_mask", "labels")
LETTERS = "abcdefgh"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from dprc_core.training.tiny import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("dpo") / "tiny", hidden=32, layers=1)
    return path, AutoTokenizer.from_pretrained(path)


def random_pairs(n, seed=0):
    """Random prompts and random answers (pairs with different gradients)."""
    g = torch.Generator().manual_seed(seed)

    def word(lo, hi):
        k = int(torch.randint(lo, hi, (), generator=g))
        return "".join(LETTERS[i] for i in torch.randint(0, 8, (k,), generator=g).tolist())

    return Dataset.from_list(
        [
            {"prompt": word(2, 6), "chosen": " " + word(1, 5), "rejected": " " + word(1, 5)}
            for _ in range(n)
        ]
    )


def toy_task(n, seed):
    """A learnable preference: after any prompt, " yes" is preferred to " no"."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p = "".join(LETTERS[i] for i in torch.randint(0, 8, (4,), generator=g).tolist())
        rows.append({"prompt": p, "chosen": " yes", "rejected": " no"})
    return Dataset.from_list(rows)


def config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "dpo"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=1,
        max_grad_norm=0.0,
        gradient_checkpointing=False,
        precompute_ref_log_probs=True,
        beta=BETA,
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
    return DPOConfig(**base)


def llama(path):
    return LlamaForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False)


def quiet(fn):
    with warnings.catch_warnings():  # σ = 0 (not private) and few steps (learnability): intended
        warnings.simplefilter("ignore", PrivacyWarning)
        warnings.simplefilter("ignore", UserWarning)
        return fn()


class ExactHead(torch.nn.Module):
    """What TRL's fused LM head returns (per-token log-probs of the labels, entropy, mean logits,
    top-1), computed from the model's ordinary float64 logits with ``params`` substituted
    (torch.func.functional_call): TRL's ``_compute_loss`` runs unchanged on top of it."""

    def __init__(self, model, params):
        super().__init__()
        self._model, self._params = [model], params

    def forward(self, labels, fused_lm_head, use_cache=False, **kwargs):
        assert fused_lm_head
        logits = torch.func.functional_call(self._model[0], self._params, (), kwargs).logits
        logits, targets = logits[:, :-1], labels[:, 1:]
        mask = targets != -100
        logp = torch.log_softmax(logits, -1)
        tok = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
        return types.SimpleNamespace(
            log_probs=tok,
            entropy=-(logp.exp() * logp).sum(-1).detach(),
            mean_logits=logits.mean(-1).detach(),
            is_top1=logits.argmax(-1) == targets,
        )


def spy_engine(monkeypatch):
    seen: list[dict] = []
    accumulate = PrivacyEngine.accumulate

    def spy(self, loss_fn, batch, example_ids=None, **kw):
        seen.append({"batch": dict(batch), "ids": example_ids})
        return accumulate(self, loss_fn, batch, example_ids, **kw)

    monkeypatch.setattr(PrivacyEngine, "accumulate", spy)
    return seen


# ----------------------------------------------------------------------------- 1. the update
def test_one_step_is_the_clipped_mean_of_trls_per_pair_gradients(tiny, tmp_path, monkeypatch):
    path, tok = tiny
    n, lr = 16, 0.5
    model = llama(path).double()
    reference = copy.deepcopy(model)  # TRL patches the trainer's model's forward (fused head)
    params = {k: p.detach().clone() for k, p in trainable_named(reference).items()}
    seen = spy_engine(monkeypatch)

    def build(c):
        return DPDPOTrainer(
            model=model,
            args=config(tmp_path, learning_rate=lr),
            train_dataset=random_pairs(n),
            processing_class=tok,
            privacy_args=PrivacyArguments(
                noise_multiplier=0.0,
                norm_method="exact",
                per_sample_max_grad_norm=c,
                dp_seed=7,
                report_train_loss=False,
            ),
        )

    trainer = quiet(lambda: build(1.0))
    collate = DataCollatorForPreference(pad_token_id=tok.pad_token_id)  # TRL's, fresh
    rows = trainer.train_dataset

    def g_pair(i):
        """torch.func gradient of TRL's DPOTrainer.compute_loss on pair i alone."""
        flat = collate([rows[i]])
        return torch.func.grad(
            lambda p: DPOTrainer.compute_loss(trainer, ExactHead(reference, p), flat)
        )(params)

    grads = [g_pair(i) for i in range(n)]
    norms = torch.stack([torch.sqrt(sum(v.pow(2).sum() for v in g.values())) for g in grads])
    c = float(norms.median())  # some pairs clipped, some not
    trainer.privacy_args.per_sample_max_grad_norm = c  # before the engine exists (train())
    before = {k: p.detach().clone() for k, p in trainable_named(model).items()}
    quiet(trainer.train)

    assert trainer.engine is not None and trainer.engine.steps == 1
    ids = torch.cat([s["ids"] for s in seen]).tolist()  # the Poisson sample the engine got
    assert len(seen) == 2 and ids and len(set(ids)) == len(ids)  # 2 micro-batches of pairs
    for s in seen:  # each row of a micro-batch is one whole pair, in TRL's tokenization
        if s["ids"].numel():
            want = pairs_from_trl(collate([rows[i] for i in s["ids"].tolist()]))
            assert s["batch"]["input_ids"].shape[1] == 2
            torch.testing.assert_close(s["batch"]["labels"], want["labels"], rtol=0, atol=0)
    stats = trainer.last_step_stats
    assert stats is not None and stats.batch_size == len(ids)
    assert 0 < stats.clipped_fraction < 1
    torch.testing.assert_close(
        torch.sort(stats.per_sample_norms).values,
        torch.sort(norms[ids]).values,
        rtol=1e-9,
        atol=0,
    )
    expected_b = 4 * 2  # the expected logical batch q·N: DP-SGD divides by it
    after = trainable_named(model)
    for name in params:
        clipped = sum(min(1.0, c / float(norms[i])) * grads[i][name] for i in ids)
        want = before[name] - lr * clipped / expected_b
        torch.testing.assert_close(after[name].detach(), want, rtol=1e-9, atol=1e-12)
    assert any(not torch.equal(after[k].detach(), before[k]) for k in before)
    for h in trainer.state.log_history:  # report_train_loss=False: no training-set metrics
        assert not {"loss", "train_loss", "rewards/accuracies", "logps/chosen"} & set(h), h
        assert "epsilon" in h


# ----------------------------------------------------------------------------- 2. the loss
def test_the_pair_loss_and_metrics_are_trls(tiny, tmp_path):
    path, tok = tiny
    model = llama(path).double()
    trainer = quiet(
        lambda: DPDPOTrainer(
            model=model,
            args=config(tmp_path),
            train_dataset=random_pairs(12, seed=3),
            processing_class=tok,
            privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=1),
        )
    )
    with torch.no_grad():  # the policy moved off the reference: rewards are not all zero
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.05)
    collate = DataCollatorForPreference(pad_token_id=tok.pad_token_id)
    rows = [trainer.train_dataset[i] for i in range(8)]
    flat = collate(rows)
    pairs = pairs_from_trl(flat)
    model.train()
    with torch.no_grad():
        ours = trainer.per_sample_loss(model, pairs)
        # TRL's own loss (its fused head, its formula) for each pair alone, and for the batch
        trl = torch.stack([DPOTrainer.compute_loss(trainer, model, collate([r])) for r in rows])
        trainer._metrics["train"].clear()
        trl_batch = DPOTrainer.compute_loss(trainer, model, flat)
        trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        # the DP step's metrics, from the forward the DP step runs (the pairs' rows)
        outputs = model(
            input_ids=pairs["input_ids"].reshape(16, -1),
            attention_mask=pairs["attention_mask"].reshape(16, -1),
        )
        stats = trainer._train_output_stats(pairs, outputs)
    assert ours.shape == (8,) and float(trl.std()) > 0.01
    torch.testing.assert_close(ours, trl.to(ours.dtype), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.mean(), trl_batch.to(ours.dtype), rtol=1e-5, atol=1e-6)
    count, *sums = stats.tolist()
    assert count == 8
    keys = (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
    )
    for key, total in zip(keys, sums, strict=True):
        assert total / count == pytest.approx(trl_metrics[key], rel=1e-4, abs=1e-5), key


# ----------------------------------------------------------------------------- 3. refusals
def test_refusals_at_construction_before_tokenizing(tiny, tmp_path, monkeypatch):
    path, tok = tiny
    prepared: list[str] = []
    monkeypatch.setattr(
        DPOTrainer, "_prepare_dataset", lambda self, *a, **k: prepared.append("called")
    )
    privacy = PrivacyArguments(target_epsilon=8.0)
    bad = config(
        tmp_path,
        loss_type=["sigmoid", "aot"],
        padding_free=True,
        precompute_ref_log_probs=False,
        use_weighting=False,
        ld_alpha=0.5,
        f_divergence_type="js_divergence",
        sync_ref_model=True,
        max_grad_norm=1.0,
    )
    with pytest.raises(DPTrainerError) as err:
        DPDPOTrainer(
            model=llama(path),
            args=bad,
            train_dataset=random_pairs(8),
            processing_class=tok,
            privacy_args=privacy,
        )
    lines = [x for x in str(err.value).splitlines() if x.startswith("- ")]
    fixes = (
        "set loss_type='sigmoid'",
        "set padding_free=False",
        "set precompute_ref_log_probs=True",
        "set ld_alpha=None",
        "set f_divergence_type='reverse_kl'",
        "set sync_ref_model=False",
        "set max_grad_norm=0",
    )
    assert len(lines) == len(fixes), lines
    for fix in fixes:
        assert sum(fix in line for line in lines) == 1, (fix, lines)
    assert "unit of privacy" in str(err.value) and "mixing units" in str(err.value)
    for kw, fix in (
        ({"loss_type": "hinge"}, "set loss_type='sigmoid'"),
        ({"use_weighting": True}, "set use_weighting=False"),
        ({"loss_weights": [2.0]}, "set loss_weights=None"),
    ):
        with pytest.raises(DPTrainerError, match=fix):
            DPDPOTrainer(
                model=llama(path),
                args=config(tmp_path, **kw),
                train_dataset=random_pairs(8),
                processing_class=tok,
                privacy_args=privacy,
            )
    with pytest.raises(DPTrainerError, match=r"no args: .*precompute_ref_log_probs=True"):
        DPDPOTrainer(
            model=llama(path),
            train_dataset=random_pairs(8),
            processing_class=tok,
            privacy_args=privacy,
        )
    with pytest.raises(DPTrainerError, match="refuses per_sample_loss"):
        DPDPOTrainer(
            model=llama(path),
            args=config(tmp_path),
            train_dataset=random_pairs(8),
            processing_class=tok,
            privacy_args=privacy,
            per_sample_loss=lambda m, b: b,
        )
    assert prepared == []  # refused before TRL tokenized anything


# ----------------------------------------------------------------------------- 4. learning
def test_a_short_dp_run_learns_a_toy_preference_with_epsilon_logged(tiny, tmp_path):
    path, tok = tiny
    trainer = quiet(
        lambda: DPDPOTrainer(
            model=llama(path),
            args=config(
                tmp_path,
                max_steps=-1,
                num_train_epochs=3,
                per_device_train_batch_size=8,
                gradient_accumulation_steps=1,
                optim="adamw_torch",
                learning_rate=0.02,
                logging_steps=4,
                per_device_eval_batch_size=16,
            ),
            train_dataset=toy_task(64, seed=0),
            eval_dataset=toy_task(16, seed=1),
            processing_class=tok,
            privacy_args=PrivacyArguments(
                noise_multiplier=0.6, per_sample_max_grad_norm=1.0, norm_method="exact", dp_seed=2
            ),
        )
    )
    start = trainer.evaluate()  # TRL's evaluation: reward accuracy on held-out pairs
    out = trainer.train()
    end = trainer.evaluate()
    assert out.global_step == trainer.plan.steps == 24
    assert 0 < out.metrics["epsilon"] == trainer.epsilon_at(24) < float("inf")
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and all(h["epsilon"] > 0 for h in logged)
    assert all("rewards/accuracies" in h and "rewards/margins" in h for h in logged)
    assert start["eval_rewards/accuracies"] <= 0.5
    assert end["eval_rewards/accuracies"] >= 0.9, (start, end)
    assert end["eval_rewards/margins"] > start["eval_rewards/margins"] + 0.5


# ----------------------------------------------------------------------------- 5. LoRA
def test_lora_reference_is_the_base_and_only_adapters_train(tiny, tmp_path):
    from peft import LoraConfig

    from dprc_core.preference import reference_logps, sequence_logps

    path, tok = tiny
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = quiet(
        lambda: DPDPOTrainer(
            model=llama(path).double(),
            args=config(tmp_path, max_steps=2, learning_rate=0.05),
            train_dataset=random_pairs(16, seed=4),
            processing_class=tok,
            peft_config=lora,
            privacy_args=PrivacyArguments(noise_multiplier=1.0, norm_method="exact", dp_seed=3),
        )
    )
    model = trainer.model
    assert trainer.ref_model is None  # no second model: the reference was computed before
    collate = DataCollatorForPreference(pad_token_id=tok.pad_token_id)
    pairs = pairs_from_trl(collate([trainer.train_dataset[i] for i in range(6)]))
    disabled = reference_logps(model, pairs)  # dprc's reference: the adapters disabled
    torch.testing.assert_close(pairs["ref_logps"].double(), disabled, rtol=1e-4, atol=1e-4)
    named = dict(model.named_parameters())
    before = {k: p.detach().clone() for k, p in named.items()}
    quiet(trainer.train)
    assert trainer.engine is not None and trainer.engine.steps == 2
    moved = {k for k, p in named.items() if not torch.equal(p.detach(), before[k])}
    assert moved and all("lora_" in k for k in moved)
    optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for k, p in named.items() if "lora_" in k}
    # after training: the precomputed reference is still the adapters-disabled model, and the
    # trained policy (adapters on) has moved away from it
    torch.testing.assert_close(reference_logps(model, pairs), disabled, rtol=0, atol=0)
    with torch.no_grad():
        policy = sequence_logps(model, {k: pairs[k].reshape(12, -1) for k in ROWS}).reshape(6, 2)
    assert float((policy - disabled).abs().max()) > 1e-3
