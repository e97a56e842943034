"""A DP plan that cannot learn is said so (issue 33, point 8): ``dprc_core.training.learnability``.

* a real DPTrainer with the Trainer's defaults (AdamW lr 5e-5, expected batch 8, 3 epochs of
  800 examples at ε = 8: 300 steps at σ = 0.45, reach lr·T·B/σ = 0.27 — the plan that stayed
  at chance accuracy in docs/benchmarks/recipes.md) emits one LearnabilityWarning that names
  the learning rate, steps, B, σ, σ/B and the reach, and what to change; the recipes' plans
  (lr 5e-3 at the same batch 8, lr 1e-3 at batch 64) emit none;
* an optimizer passed in ``optimizers=`` is judged by its own learning rate; plain SGD by its
  steps only; a plan of too few steps warns whatever its learning rate;
* σ = 0 (not private) and ν-DP-FTRL are not judged;
* ``dprc train``'s runner warns on the same criterion.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import default_data_collator

from dprc_core.integrations import DPTrainer, PrivacyArguments
from dprc_core.training.learnability import (
    MIN_REACH,
    MIN_STEPS,
    LearnabilityWarning,
    assess,
    is_adaptive,
    warn_if_unlearnable,
)
from dprc_core.training.plan import plan_privacy
from dprc_core.training.runner import JobSpec, start_run
from dprc_core.training.tiny import build_tiny_llama
from tests.dprc_core.integrations.test_hf_trainer import llama, lm_examples, targs

N = 800  # the size of data/demo/reviews_train.jsonl, where the threshold was measured
DEFAULTS = dict(  # the Trainer's defaults (targs() sets SGD and a constant schedule)
    optim="adamw_torch",
    learning_rate=5e-5,
    lr_scheduler_type="linear",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=1,
    num_train_epochs=3,
)


def trainer(tiny_llama_path, tmp_path, privacy=None, optimizers=None, **args):
    model = llama(tiny_llama_path)
    extra = {}
    if optimizers is not None:
        extra["optimizers"] = (optimizers(model), None)
    return DPTrainer(
        model=model,
        args=targs(tmp_path, **args),
        train_dataset=lm_examples(n=N),
        data_collator=default_data_collator,
        privacy_args=privacy or PrivacyArguments(target_epsilon=8.0, norm_method="exact"),
        **extra,
    )


def flagged(build):
    """The LearnabilityWarnings emitted while ``build()`` runs, and its result."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = build()
    return [w for w in caught if issubclass(w.category, LearnabilityWarning)], out


def test_the_trainer_defaults_warn_once_with_their_numbers(tiny_llama_path, tmp_path):
    caught, t = flagged(lambda: trainer(tiny_llama_path, tmp_path, **DEFAULTS))
    assert len(caught) == 1
    assert issubclass(caught[0].category, UserWarning)
    assert caught[0].filename == __file__  # points at the code that built the DPTrainer
    plan = t.plan
    assert (plan.batch_size, plan.steps) == (8, 300)
    ratio = plan.noise_multiplier / 8
    reach = 5e-5 * 300 / ratio
    assert 0.2 < reach < MIN_REACH
    text = str(caught[0].message)
    for part in (
        "learning rate 5e-05 over 300 steps at expected batch 8",
        f"σ = {plan.noise_multiplier:.3g}",
        f"σ/B = {ratio:.3g}·C per coordinate",
        f"lr·T·B/σ = {reach:.3g} (below 1)",
        f"raise the learning rate to well above {5e-5 * MIN_REACH / reach:.2g}",
        "5e-3 for LoRA",
        "or train for more epochs",
        '"Recipes"',
    ):
        assert part in text, part
    assert "gradient_accumulation_steps" not in text  # a larger batch does not raise the reach


@pytest.mark.parametrize(
    ("learning_rate", "batch", "accumulation", "epochs"),
    [(5e-3, 8, 1, 3), (1e-3, 16, 4, 5)],  # LoRA's lr at the defaults' batch; full fine-tuning
)
def test_the_recipes_do_not_warn(
    tiny_llama_path, tmp_path, learning_rate, batch, accumulation, epochs
):
    caught, t = flagged(
        lambda: trainer(
            tiny_llama_path,
            tmp_path,
            **{
                **DEFAULTS,
                "learning_rate": learning_rate,
                "per_device_train_batch_size": batch,
                "gradient_accumulation_steps": accumulation,
                "num_train_epochs": epochs,
            },
        )
    )
    assert caught == []
    assert t.plan.steps >= MIN_STEPS
    reach = learning_rate * t.plan.steps * t.plan.batch_size / t.plan.noise_multiplier
    assert reach > 5 * MIN_REACH


def test_an_optimizer_passed_in_is_judged_by_its_learning_rate(tiny_llama_path, tmp_path):
    recipe_lr = {**DEFAULTS, "learning_rate": 5e-3}  # would not warn on its own
    caught, _ = flagged(
        lambda: trainer(
            tiny_llama_path,
            tmp_path,
            optimizers=lambda m: torch.optim.Adam(m.parameters(), lr=5e-5),
            **recipe_lr,
        )
    )
    assert len(caught) == 1 and "learning rate 5e-05" in str(caught[0].message)
    caught, _ = flagged(
        lambda: trainer(
            tiny_llama_path,
            tmp_path,
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=5e-5),
            **recipe_lr,
        )
    )
    assert caught == []  # plain SGD: judged by its steps only


def test_too_few_steps_warn_whatever_the_learning_rate(tiny_llama_path, tmp_path):
    with pytest.warns(LearnabilityWarning, match=r"7 optimizer steps \(fewer than 10\)") as rec:
        t = trainer(
            tiny_llama_path,
            tmp_path,
            **{
                **DEFAULTS,
                "learning_rate": 0.1,
                "per_device_train_batch_size": 32,
                "gradient_accumulation_steps": 4,
                "num_train_epochs": 1,
            },
        )
    assert t.plan.steps == 7 < MIN_STEPS
    text = str(rec[0].message)
    assert "lr·T·B/σ" not in text and "raise the learning rate" not in text  # only what applies
    assert "use a smaller per_device_train_batch_size · gradient_accumulation_steps" in text


def test_no_noise_is_not_judged(tiny_llama_path, tmp_path):
    caught, _ = flagged(
        lambda: trainer(
            tiny_llama_path,
            tmp_path,
            privacy=PrivacyArguments(noise_multiplier=0.0, norm_method="exact"),
            **DEFAULTS,
        )
    )
    assert caught == []


def test_the_criterion():
    defaults = plan_privacy(
        dataset_size=N, batch_size=8, epochs=3, clipping="exact", k=None, target_epsilon=8.0
    )
    v = assess(defaults.noise_multiplier, 8, defaults.steps, 5e-5)
    assert not v.ok and v.noise_ratio == pytest.approx(defaults.noise_multiplier / 8)
    assert v.reach == pytest.approx(5e-5 * 300 * 8 / defaults.noise_multiplier)
    assert assess(defaults.noise_multiplier, 8, defaults.steps, 5e-3).ok  # lora-batch8
    assert assess(1.0, 64, 100, 1 / 6400).ok  # reach exactly 1
    assert not assess(1.0, 64, 100, 0.99 / 6400).ok
    assert assess(1.0, 64, 100, 1e-6, adaptive=False).ok  # SGD: steps only
    assert assess(1.0, 64, 100).ok and assess(1.0, 64, 100).reach is None  # no lr given
    assert assess(0.0, 8, 100, 1e-9).ok  # no noise: no reach
    assert assess(1.0, 64, 10, 1.0).ok and not assess(1.0, 64, 9, 1.0).ok
    assert assess(1.0, 64, 100, 1.0).message() == ""
    with pytest.raises(ValueError, match="expected_batch_size"):
        assess(1.0, 0, 100, 1e-3)
    assert is_adaptive("adamw_torch") and is_adaptive("AdamW") and is_adaptive("paged_lion_8bit")
    assert not is_adaptive("sgd") and not is_adaptive("SGD")
    nu = plan_privacy(
        dataset_size=N,
        batch_size=8,
        epochs=3,
        clipping="exact",
        k=None,
        target_epsilon=8.0,
        mechanism="nu_dpftrl",
        nu=0.5,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_unlearnable(nu, 5e-5) is None


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("learnability-job")
    model = build_tiny_llama(tmp / "llama", hidden=32)
    train = tmp / "train.jsonl"
    train.write_text("".join(json.dumps({"text": "ab" * (3 + i % 4)}) + "\n" for i in range(N)))
    return model, train


@pytest.mark.parametrize(("learning_rate", "warns"), [(5e-5, True), (5e-3, False)])
def test_the_runner_warns_on_the_same_criterion(tiny_job, tmp_path, learning_rate, warns):
    model, train = tiny_job
    spec = JobSpec(
        model=str(model),
        task="causal_lm",
        train_file=str(train),
        output_dir=str(tmp_path / "out"),
        epochs=3,
        batch_size=8,
        learning_rate=learning_rate,
        max_seq_len=16,
        norm_method="exact",
        seed=0,
    )
    caught, run = flagged(lambda: start_run(spec))
    run.engine.detach()
    assert len(caught) == int(warns)
    if warns:
        assert "raise the learning rate to well above" in str(caught[0].message)
