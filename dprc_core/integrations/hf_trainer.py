"""``DPTrainer``: a ``transformers.Trainer`` whose every optimizer step is one DP-SGD(-RC) step.

The model is not wrapped: dprc's :class:`~dprc_core.engine.PrivacyEngine` attaches its hooks to
the model the Trainer holds, once the Trainer has placed it (so peft LoRA works whatever the
order of ``get_peft_model`` and ``.to(device)``). What the Trainer does is kept where it does not
touch privacy and replaced where it does:

* the training data loader is **real Poisson sampling** at rate q = B/N, with B =
  ``per_device_train_batch_size · gradient_accumulation_steps`` (the expected logical batch): a
  Trainer step is one Poisson batch, split into ``gradient_accumulation_steps`` micro-batches
  (their sizes are random; an empty one is a step that adds noise only). The batch that ran is
  the batch that was accounted;
* ``training_step`` adds a micro-batch's clipped per-sample gradients (the per-sample loss from
  the model's outputs: causal LM with labels -100 ignored, or sequence classification, or the
  ``per_sample_loss`` given); the Trainer's ``optimizer.step()`` is the engine's step: noise
  once, divide by B, the real optimizer's step;
* the steps are planned by dprc's planner (one step rule ⌈epochs·N/B⌉, or ``max_steps``) and
  σ calibrated for ``target_epsilon`` unless ``noise_multiplier`` is given;
* ε spent is in every log (hence TensorBoard and any ``report_to``) and the final metrics;
  ``save_model`` writes safetensors plus ``privacy_ledger.json``; a Trainer checkpoint also
  holds ``dprc_private/`` (the engine's generator and noise states: PRIVATE, never share it),
  from which ``train(resume_from_checkpoint=...)`` continues exactly.

What would break privacy is refused when the trainer is built (see :func:`_refusals`).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainerCallback
from transformers.utils import logging as hf_logging

from dprc_core.accounting import PrivacyLedger
from dprc_core.accounting.events import default_sketch
from dprc_core.batching import batch_size, select_samples
from dprc_core.engine import (
    PrivacyEngine,
    PrivacyWarning,
    StepStats,
    accounting_envelope_for,
    layer_methods,
)
from dprc_core.integrations.privacy_arguments import PrivacyArguments
from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from dprc_core.noise import NuDPFTRL
from dprc_core.seeding import derive_seed, fresh_seed
from dprc_core.training.plan import PrivacyPlan, plan_privacy
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler

logger = hf_logging.get_logger(__name__)

PerSampleLoss = Callable[[torch.nn.Module, Any], torch.Tensor]
PRIVATE_DIRNAME = "dprc_private"  # inside a Trainer checkpoint: never release
LEDGER_NAME = "privacy_ledger.json"
PRIVACY_NAME = "privacy.json"
_ENGINE_FILE = "engine.safetensors"
_STATE_FILE = "state.json"


class DPTrainerError(ValueError):
    """A Trainer setting that DPTrainer refuses because it would break the privacy guarantee
    (or make the reported ε wrong)."""


# --------------------------------------------------------------------------- refusals
def _refusals(trainer: Trainer) -> list[str]:
    """Every reason this Trainer setup cannot be run privately (empty: fine)."""
    args = trainer.args
    reasons: list[str] = []

    def refuse(cond: bool, why: str) -> None:
        if cond:
            reasons.append(why)

    refuse(
        args.max_grad_norm is not None and args.max_grad_norm > 0,
        f"TrainingArguments.max_grad_norm={args.max_grad_norm}: the Trainer's global clipping "
        "acts on the batch's summed, not yet noised gradient (a data-dependent rescaling "
        "outside the accounted mechanism) and logs its un-noised norm; set max_grad_norm=0 and "
        "bound each example with PrivacyArguments.per_sample_max_grad_norm",
    )
    strategy = getattr(args, "train_sampling_strategy", "random")
    refuse(
        bool(getattr(args, "group_by_length", False)) or strategy == "group_by_length",
        "group_by_length: batches of similar lengths are not Poisson samples, so the "
        "accountant's amplification by sampling would not hold",
    )
    refuse(
        strategy not in ("random", "group_by_length"),
        f"train_sampling_strategy={strategy!r}: DPTrainer's batches are Poisson samples (the "
        "sampling the accountant assumes); another sampler cannot be honoured",
    )
    for name in ("_get_train_sampler", "get_train_dataloader", "training_step"):
        overridden = getattr(type(trainer), name) is not getattr(DPTrainer, name)
        refuse(
            overridden,
            f"{type(trainer).__name__} overrides {name}: the training batches must be DPTrainer's "
            "Poisson batches and each micro-batch must go through the engine",
        )
    refuse(
        args.world_size > 1 or args.n_gpu > 1,
        f"distributed or DataParallel training (world_size={args.world_size}, "
        f"n_gpu={args.n_gpu}): not supported yet; every process would sample and noise alone",
    )
    refuse(
        bool(args.deepspeed) or bool(args.fsdp) or trainer.is_fsdp_enabled,
        "DeepSpeed / FSDP: they own the backward and the gradients, which must be dprc's "
        "clipped per-sample sums",
    )
    refuse(
        bool(getattr(args, "activation_checkpointing", False))
        or bool(getattr(args, "gradient_checkpointing", False)),
        "gradient (activation) checkpointing: its recomputed forward is invisible to dprc's "
        "per-sample hooks",
    )
    refuse(
        args.auto_find_batch_size,
        "auto_find_batch_size: it changes the batch size, hence the sample rate the privacy was "
        "planned for",
    )
    refuse(
        args.dataloader_drop_last,
        "dataloader_drop_last: Poisson batches are never cut; dropping examples changes the "
        "sampling",
    )
    refuse(
        args.ignore_data_skip,
        "ignore_data_skip: a resumed run would redraw the batches of the steps already run, "
        "which were not accounted twice",
    )
    refuse(
        args.label_smoothing_factor > 0,
        "label_smoothing_factor: the per-sample loss is plain cross-entropy; smoothing would "
        "silently not happen",
    )
    refuse(
        str(args.optim).lower().endswith("lomo"),
        f"optim={args.optim}: LOMO optimizers update inside the backward, before the noise",
    )
    refuse(
        args.push_to_hub,
        "push_to_hub: Trainer checkpoints hold the noise generator's state (dprc_private/); "
        "upload the model written by save_model yourself",
    )
    refuse(
        trainer.model_init is not None,
        "model_init: the privacy plan and the engine are made for the model given",
    )
    refuse(
        isinstance(trainer.train_dataset, torch.utils.data.IterableDataset)
        or not hasattr(trainer.train_dataset, "__len__"),
        "an iterable (unsized) train_dataset: Poisson sampling needs the N examples indexable",
    )
    collator = getattr(trainer, "data_collator", None)
    refuse(
        type(collator).__name__ == "DataCollatorWithFlattening"
        or bool(getattr(collator, "padding_free", False)),
        f"data collator {type(collator).__name__} flattens examples into one row (padding "
        "free): a row must be one example, the unit of privacy",
    )
    return reasons


# --------------------------------------------------------------------------- data
class _PoissonMicroBatches(torch.utils.data.Sampler[list[int]]):
    """The batch sampler of the training loader: for each planned step, a Poisson batch (or
    ν-DP-FTRL's fixed-order batch) split into ``micro_batches`` consecutive index lists.

    The seed is read when iteration starts (a resumed trainer restores it first) and every
    iteration starts from step 0, so skipping the first k·micro_batches lists (as the Trainer
    does on resume) continues exactly where an uninterrupted run would be."""

    def __init__(self, n: int, plan: PrivacyPlan, micro_batches: int, seed: Callable[[], int]):
        self.n, self.plan, self.micro_batches, self._seed = n, plan, micro_batches, seed
        self.batch_size = max(1, round(plan.batch_size / micro_batches))  # nominal, for logs

    def __len__(self) -> int:
        return self.plan.steps * self.micro_batches

    def __iter__(self) -> Iterator[list[int]]:
        seed = derive_seed(self._seed(), "sampler")
        sampler: PoissonSampler | FixedOrderSampler
        if self.plan.mechanism == NuDPFTRL.name:
            sampler = FixedOrderSampler(
                self.n, int(self.plan.batch_size), steps=self.plan.steps, seed=seed
            )
        else:
            sampler = PoissonSampler(self.n, self.plan.sample_rate, self.plan.steps, seed=seed)
        for idx in sampler:
            for chunk in torch.tensor_split(idx, self.micro_batches):
                yield chunk.tolist()


# the batch key that carries each row's data set index from the collator to training_step
# (the per-example sketches' keys), removed before the model sees the batch
_EXAMPLE_IDS = "dprc_example_ids"


class _Indexed(torch.utils.data.Dataset):
    """The training set, each item paired with its index (the per-example sketch key)."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return i, self.dataset[i]

    def __getitems__(self, indices: list[int]) -> list[tuple[int, Any]]:
        # the batched fetch of the wrapped set where it has one (Hugging Face datasets do)
        fetch = getattr(self.dataset, "__getitems__", None)
        items = fetch(indices) if fetch is not None else [self.dataset[i] for i in indices]
        return list(zip(indices, items, strict=True))


class _ExampleCollator:
    """The user's collator, checked to keep one row per example; an empty micro-batch is the
    collated first example with zero rows (the engine skips it; the step still adds noise).
    A mapping batch also carries the rows' data set indices under ``_EXAMPLE_IDS``."""

    def __init__(self, collate: Callable[[list[Any]], Any], dataset: Any):
        self.collate, self.dataset = collate, dataset

    def __call__(self, indexed: list[tuple[int, Any]]) -> Any:
        ids = torch.tensor([i for i, _ in indexed], dtype=torch.long)
        examples = [example for _, example in indexed]
        if not examples:
            one = self._as_dict(self.collate([self.dataset[0]]))
            return self._with_ids(select_samples(one, torch.zeros(0, dtype=torch.long), 1), ids)
        out = self._as_dict(self.collate(examples))
        rows = batch_size(out)
        if rows != len(examples):
            raise DPTrainerError(
                f"the data collator turned {len(examples)} examples into a batch of {rows} rows: "
                "each row must be one example (the unit of privacy); packing or flattening "
                "collators are refused"
            )
        return self._with_ids(out, ids)

    @staticmethod
    def _with_ids(batch: Any, ids: torch.Tensor) -> Any:
        if isinstance(batch, dict):
            if _EXAMPLE_IDS in batch:
                raise DPTrainerError(f"the collated batch already has a key {_EXAMPLE_IDS!r}")
            batch[_EXAMPLE_IDS] = ids
        return batch  # another batch type: the engine keys examples by position

    @staticmethod
    def _as_dict(batch: Any) -> Any:
        return dict(batch) if isinstance(batch, Mapping) else batch


# --------------------------------------------------------------------------- optimizer
class _EngineStepOptimizer(torch.optim.Optimizer):
    """What the Trainer holds as its optimizer: ``step()`` is the engine's step (noise once,
    divide by B, then the real optimizer's step); everything else is the real optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, step: Callable[[], None]):
        # no Optimizer.__init__: the parameters, groups and state are the wrapped optimizer's
        self.optimizer = optimizer
        self._engine_step = step

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("DPTrainer's optimizer step takes no closure")
        self._engine_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise DPTrainerError("the engine's parameters are fixed once it is built")

    def __repr__(self) -> str:
        return f"EngineStep({self.optimizer!r})"


class _StopBeforeMaxEpsilon(TrainerCallback):
    def __init__(self, trainer: DPTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        if t.allowed_steps < t.plan.steps and state.global_step >= t.allowed_steps:
            t.stop_reason = (
                f"stopped after {state.global_step} of {t.plan.steps} planned steps: one more "
                f"step would spend more than max_epsilon={t.privacy_args.max_epsilon} "
                f"(ε after {state.global_step} steps: {t.epsilon_at(state.global_step):.4g} "
                f"at δ={t.plan.delta:g})"
            )
            logger.warning(t.stop_reason)
            control.should_training_stop = True
        return control


# --------------------------------------------------------------------------- the trainer
def default_per_sample_loss(model: torch.nn.Module) -> PerSampleLoss:
    """The per-sample loss of a causal LM or a sequence classifier (peft models unwrapped)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    base = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model
    name = type(base).__name__
    if name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return causal_lm_per_sample_loss
    if name in set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values()):
        return sequence_classification_per_sample_loss
    raise DPTrainerError(
        f"no default per-sample loss for {name}: pass per_sample_loss=fn, with fn(model, batch) "
        "returning one loss per example (shape [B])"
    )


class DPTrainer(Trainer):
    """``transformers.Trainer`` with DP-SGD(-RC): pass ``privacy_args``
    (:class:`PrivacyArguments`) besides the Trainer's own arguments; optionally
    ``per_sample_loss(model, batch) -> Tensor[B]`` for a model that is neither a causal LM
    nor a sequence classifier.

    After construction ``plan`` holds the privacy plan (steps, q, σ, δ, planned ε);
    ``engine`` is built with the optimizer; ``epsilon_at(steps)`` is ε spent after ``steps``.
    """

    def __init__(
        self,
        *args: Any,
        privacy_args: PrivacyArguments,
        per_sample_loss: PerSampleLoss | None = None,
        **kwargs: Any,
    ):
        if not isinstance(privacy_args, PrivacyArguments):
            raise TypeError("privacy_args must be a PrivacyArguments")
        super().__init__(*args, **kwargs)
        self.privacy_args = privacy_args
        reasons = _refusals(self)
        if reasons:
            raise DPTrainerError("DPTrainer refuses this setup:\n- " + "\n- ".join(reasons))
        if self.args.fp16:
            # dprc forms the clipped sums itself (no loss.backward): a loss scaler would unscale
            # gradients it never scaled. fp16 autocast runs without loss scaling.
            self.accelerator.scaler = None
        self.per_sample_loss = per_sample_loss or default_per_sample_loss(self.dp_model)
        self.dp_seed = privacy_args.dp_seed if privacy_args.dp_seed is not None else fresh_seed()
        self._eps: dict[int, float] = {}
        self.plan, self.clipping = self._plan()
        self.args = copy.copy(self.args)  # the user's TrainingArguments stay as given
        self.args.max_steps = self.plan.steps  # the loop runs exactly the planned steps
        self.allowed_steps = self._steps_within_max_epsilon()
        self.stop_reason: str | None = None
        self.engine: PrivacyEngine | None = None
        self.last_step_stats: StepStats | None = None
        self.add_callback(_StopBeforeMaxEpsilon(self))

    @property
    def dp_model(self) -> torch.nn.Module:
        """The model the engine's hooks are on (the Trainer's ``model``)."""
        if not isinstance(self.model, torch.nn.Module):
            raise DPTrainerError("DPTrainer needs a model")
        return self.model

    # -- planning and ε
    def _plan(self) -> tuple[PrivacyPlan, str]:
        p, args = self.privacy_args, self.args
        n = len(self.train_dataset)  # type: ignore[arg-type]  # sized: checked in _refusals
        b = args.per_device_train_batch_size * args.gradient_accumulation_steps
        if p.noise_mechanism == NuDPFTRL.name and p.nu is None:
            raise DPTrainerError("noise_mechanism='nu_dpftrl' needs PrivacyArguments.nu")
        methods = layer_methods(self.dp_model, p.norm_method, p.k, p.max_seq_len)
        clipping = accounting_envelope_for(methods)
        sigma_zero = p.noise_multiplier == 0
        if sigma_zero:
            warnings.warn(
                "noise_multiplier=0: no noise is added, the updates are NOT differentially "
                "private (ε is reported as infinite and no privacy ledger is written)",
                PrivacyWarning,
                stacklevel=3,
            )
        epochs: float = args.num_train_epochs
        if args.max_steps > 0:
            epochs = _epochs_for_steps(n, b, args.max_steps, p.noise_mechanism)
        plan = plan_privacy(
            dataset_size=n,
            batch_size=b,
            epochs=epochs if p.noise_mechanism != NuDPFTRL.name else int(epochs),
            clipping=clipping,
            k=p.k,
            target_epsilon=p.target_epsilon,
            delta=p.target_delta,
            # σ = 0 has no finite ε: plan the steps, q and δ with σ = 1, then set σ = 0, ε = ∞
            noise_multiplier_value=1.0 if sigma_zero else p.noise_multiplier,
            mechanism=p.noise_mechanism,
            nu=p.nu,
            bands=p.bands,
            # nothing sketched (an auto plan of exact layers): nothing drawn per example
            sketch=p.sketch if clipping != "exact" else default_sketch(randomized=False),
        )
        if args.max_steps > 0 and plan.steps != args.max_steps:
            raise DPTrainerError(
                f"max_steps={args.max_steps} is not a whole number of "
                f"{p.noise_mechanism} epochs of {math.ceil(n / b)} steps"
            )
        if sigma_zero:
            plan = dataclasses.replace(plan, noise_multiplier=0.0, planned_epsilon=math.inf)
        return plan, clipping

    def ledger_at(self, steps: int) -> PrivacyLedger:
        """The privacy ledger of the first ``steps`` steps of the plan."""
        if self.plan.noise_multiplier == 0:
            raise DPTrainerError("noise_multiplier=0 is not private: there is no privacy ledger")
        return PrivacyLedger([self.plan.event(steps)] if steps else [])

    def epsilon_at(self, steps: int) -> float:
        """ε spent after ``steps`` steps at the plan's δ (the accountant; cached per count)."""
        if self.plan.noise_multiplier == 0:
            return math.inf if steps else 0.0
        if steps not in self._eps:
            self._eps[steps] = self.ledger_at(steps).epsilon(self.plan.delta) if steps else 0.0
        return self._eps[steps]

    def _steps_within_max_epsilon(self) -> int:
        cap = self.privacy_args.max_epsilon
        if cap is not None and self.plan.noise_multiplier == 0:
            raise DPTrainerError(f"max_epsilon={cap} with noise_multiplier=0: ε is infinite")
        if cap is None or self.plan.planned_epsilon <= cap:
            return self.plan.steps
        lo, hi = 0, self.plan.steps  # ε(lo) <= cap < ε(hi): ε only grows with steps
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.epsilon_at(mid) <= cap else (lo, mid)
        if lo == 0:
            raise DPTrainerError(
                f"max_epsilon={cap}: even one step spends ε={self.epsilon_at(1):.4g} at "
                f"δ={self.plan.delta:g}"
            )
        return lo

    # -- data
    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        dataset = self.train_dataset
        if dataset is None:
            raise ValueError("DPTrainer: training requires a train_dataset")
        collate = self.data_collator
        try:
            hf_dataset = importlib.import_module("datasets").Dataset
        except ImportError:
            hf_dataset = None
        is_hf = hf_dataset is not None and isinstance(dataset, hf_dataset)
        if is_hf:
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collate = self._get_collator_with_removed_columns(collate, description="training")
        batches = _PoissonMicroBatches(
            len(cast(Any, dataset)),  # sized: an unsized train_dataset is refused
            self.plan,
            self.args.gradient_accumulation_steps,
            lambda: self.dp_seed,
        )
        loader = torch.utils.data.DataLoader(
            _Indexed(dataset),
            batch_sampler=batches,
            collate_fn=_ExampleCollator(collate, dataset),
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        raise DPTrainerError("DPTrainer samples its batches itself (Poisson)")

    # -- the step
    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        optimizer = super().create_optimizer(model)
        if isinstance(optimizer, _EngineStepOptimizer):
            return optimizer
        p = self.privacy_args
        self.engine = PrivacyEngine(
            self.dp_model,
            optimizer,
            clipping=p.clipping(),
            noise=p.noise(self.plan.noise_multiplier),
            expected_batch_size=self.plan.batch_size,
            seed=self.dp_seed,
        )
        if (self.engine.accounting_envelope, self.engine.accounting_sketch) != (
            self.clipping,
            self.plan.sketch,
        ):
            raise RuntimeError("the engine's norm plan differs from the one the plan accounted")
        self.optimizer = _EngineStepOptimizer(optimizer, self._engine_step)
        return self.optimizer

    def _engine_step(self) -> None:
        engine = self.engine
        assert engine is not None  # built with the optimizer
        if engine.steps >= self.allowed_steps:
            raise RuntimeError(
                f"refusing step {engine.steps + 1}: the plan allows {self.allowed_steps} steps "
                f"(planned {self.plan.steps}, max_epsilon={self.privacy_args.max_epsilon})"
            )
        self.last_step_stats = engine.step()

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """One micro-batch of the logical batch through the engine; returns Σ of its per-sample
        losses / B (so the Trainer's logged loss is the batch's Σ loss / B, as the update)."""
        engine = self.engine
        assert engine is not None  # built with the optimizer, before the first step
        model.train()
        inputs = dict(inputs)
        ids = inputs.pop(_EXAMPLE_IDS, None)  # the rows' data set indices (sketch keys)
        batch = self._prepare_input(inputs)
        seen: list[torch.Tensor] = []

        def loss_fn(m: torch.nn.Module, b: Any) -> torch.Tensor:
            losses = self.per_sample_loss(m, b)
            if b is batch:
                seen.append(losses.detach())
            return losses

        with self.compute_loss_context_manager():
            engine.accumulate(loss_fn, batch, None if ids is None else ids.cpu())
        total = torch.zeros((), device=self.args.device)
        if seen:
            losses = seen[-1].float()
            total = losses[torch.isfinite(losses)].sum().to(self.args.device)
        return total / self.plan.batch_size

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        # before the optimizer step the gradients are the clipped sum without its noise: their
        # norm is not private, so it is not logged
        return None

    # -- logs
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        steps = self.state.global_step
        # the loader holds every planned step as one Trainer epoch: report passes over the data
        self.state.epoch = steps * self.plan.batch_size / self.plan.dataset_size
        logs["epsilon"] = self.epsilon_at(steps)
        if "train_runtime" in logs:  # the final metrics
            logs["delta"] = self.plan.delta
            logs["noise_multiplier"] = self.plan.noise_multiplier
            logs["dp_steps"] = steps
        super().log(logs, start_time)

    def privacy_report(self) -> dict[str, Any]:
        """Steps run and planned, ε spent at δ, and the plan (JSON-able)."""
        steps = self.engine.steps if self.engine is not None else 0
        eps = self.epsilon_at(steps)
        return {
            "steps": steps,
            "planned_steps": self.plan.steps,
            "epsilon": eps if math.isfinite(eps) else None,
            "private": math.isfinite(eps),
            "delta": self.plan.delta,
            "noise_mechanism": self.plan.mechanism,
            "norm_method": self.privacy_args.norm_method,
            "per_sample_max_grad_norm": self.privacy_args.per_sample_max_grad_norm,
            "plan": self.plan.to_dict(),
            "stop_reason": self.stop_reason,
        }

    # -- saving and resuming
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        if not self.args.should_save:
            return
        out = Path(str(output_dir if output_dir is not None else self.args.output_dir))
        steps = self.engine.steps if self.engine is not None else 0
        if self.plan.noise_multiplier > 0:
            (out / LEDGER_NAME).write_text(self.ledger_at(steps).to_json())
        (out / PRIVACY_NAME).write_text(json.dumps(self.privacy_report(), indent=1))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.save_only_model or not self.args.should_save or self.engine is None:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        private = Path(folder) / PRIVATE_DIRNAME
        private.mkdir(mode=0o700, exist_ok=True)
        private.chmod(0o700)
        est = self.engine.state_dict()
        tensors = {f"engine:{k}": v for k, v in est["generators"].items()}
        tensors.update({f"noise:{k}": v for k, v in est["noise"].items()})
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(private / _ENGINE_FILE))
        state = {"steps": est["steps"], "seed": est["seed"], "plan": self.plan.to_dict()}
        (private / _STATE_FILE).write_text(json.dumps(state, sort_keys=True))
        for f in private.iterdir():
            f.chmod(0o600)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        private = Path(checkpoint) / PRIVATE_DIRNAME
        if not (private / _STATE_FILE).is_file():
            raise DPTrainerError(
                f"{checkpoint} has no {PRIVATE_DIRNAME}/: it was not written by DPTrainer (or "
                "with save_only_model); resuming needs the engine's noise and sampling state"
            )
        state = json.loads((private / _STATE_FILE).read_text())
        if state["plan"] != json.loads(json.dumps(self.plan.to_dict())):
            raise DPTrainerError(
                f"the checkpoint {checkpoint} was written for another privacy plan "
                f"({state['plan']}); this trainer plans {self.plan.to_dict()}"
            )
        if int(state["steps"]) != self.state.global_step:
            raise DPTrainerError(
                f"the checkpoint's engine ran {state['steps']} steps but its Trainer state "
                f"{self.state.global_step}"
            )
        tensors = load_file(str(private / _ENGINE_FILE))
        assert self.engine is not None  # built with the optimizer, before this load
        self.engine.load_state_dict(
            {
                "steps": state["steps"],
                "seed": state["seed"],
                "generators": {
                    k[len("engine:") :]: v for k, v in tensors.items() if k.startswith("engine:")
                },
                "noise": {
                    k[len("noise:") :]: v for k, v in tensors.items() if k.startswith("noise:")
                },
            }
        )
        self.dp_seed = int(state["seed"])  # the batch sampler reads it when iteration starts


def _epochs_for_steps(n: int, b: int, steps: int, mechanism: str) -> float:
    """Epochs whose planned steps (the one step rule) are exactly ``steps``."""
    from dprc_core.accounting.steps import planned_steps

    if mechanism == NuDPFTRL.name:
        per_epoch = -(-n // b)
        return steps / per_epoch
    epochs = steps * b / n
    for _ in range(64):  # the float nearest steps·b/n may round one step up
        if planned_steps(n, b, epochs) <= steps:
            break
        epochs = math.nextafter(epochs, 0.0)
    return epochs
