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
  σ calibrated for ``target_epsilon`` unless ``noise_multiplier`` is given; the Trainer's
  epochs are the plan's (epoch e ends after ⌈e·N/B⌉ steps, :class:`_EpochClock`), so
  per-epoch eval / log / save strategies fire once per epoch, and the steps run are exactly
  the planned steps;
* ε spent is in every log (hence TensorBoard and any ``report_to``) and the final metrics;
  ``save_model`` writes safetensors plus ``privacy_ledger.json``, ``privacy.json`` and
  ``training_args.json`` (never the Trainer's pickled ``training_args.bin``); a Trainer
  checkpoint also holds ``dprc_private/`` (the engine's generator and noise states: PRIVATE,
  never share it), from which ``train(resume_from_checkpoint=...)`` in a new DPTrainer
  continues exactly. A DPTrainer trains once: a second ``train()`` is refused.

What would break privacy is refused, every reason at once, before the parent's ``__init__``
(which may prepare the data) where the constructor's arguments decide it (see
:func:`_input_refusals`), else right after it.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import importlib
import inspect
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainerCallback
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging as hf_logging

from dprc_core.accounting import PrivacyLedger
from dprc_core.accounting.event_checks import recorded_scale_width
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
from dprc_core.seeding import derive_seed, fresh_seed
from dprc_core.training.data import DataError
from dprc_core.training.learnability import is_adaptive, warn_if_unlearnable
from dprc_core.training.plan import PrivacyPlan, plan_privacy
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler
from dprc_core.training.token_store import (
    check_user_keys,
    count_user_ids,
    user_id_hash,
    user_key,
)
from dprc_core.training.user_sampling import (
    DEFAULT_EXAMPLES_PER_USER,
    UserIndex,
    UserPoissonSampler,
    split_between_users,
)

logger = hf_logging.get_logger(__name__)

PerSampleLoss = Callable[[torch.nn.Module, Any], torch.Tensor]
PRIVATE_DIRNAME = "dprc_private"  # inside a Trainer checkpoint: never release
LEDGER_NAME = "privacy_ledger.json"
PRIVACY_NAME = "privacy.json"
TRAINING_ARGS_JSON = "training_args.json"  # save_model: the arguments, in place of the pickle
_ENGINE_FILE = "engine.safetensors"
_STATE_FILE = "state.json"
# logged values computed on the training data (not covered by DP): only with report_train_loss
_TRAIN_SET_LOGS = ("loss", "train_loss")


class DPTrainerError(ValueError):
    """A Trainer setting that DPTrainer refuses because it would break the privacy guarantee
    (or make the reported ε wrong)."""


# --------------------------------------------------------------------------- refusals
def _args_refusals(args: Any) -> list[str]:
    """The refusals that the TrainingArguments decide alone, each naming the setting to change
    (checked before the parent's ``__init__``, hence before any data work)."""
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
        "accountant's amplification by sampling would not hold; set "
        "train_sampling_strategy='random' (group_by_length=False)",
    )
    refuse(
        strategy not in ("random", "group_by_length"),
        f"train_sampling_strategy={strategy!r}: DPTrainer's batches are Poisson samples (the "
        "sampling the accountant assumes); another sampler cannot be honoured; set "
        "train_sampling_strategy='random'",
    )
    refuse(
        args.world_size > 1 or args.n_gpu > 1,
        f"distributed or DataParallel training (world_size={args.world_size}, "
        f"n_gpu={args.n_gpu}): not supported yet, every process would sample and noise alone; "
        "run one process on one device (e.g. CUDA_VISIBLE_DEVICES=0, no torchrun or "
        "accelerate launch), or use dprc train for several devices",
    )
    refuse(
        bool(args.deepspeed) or bool(args.fsdp),
        "deepspeed / fsdp: they own the backward and the gradients, which must be dprc's "
        "clipped per-sample sums; unset deepspeed and fsdp",
    )
    refuse(
        bool(getattr(args, "activation_checkpointing", False))
        or bool(getattr(args, "gradient_checkpointing", False)),
        "gradient_checkpointing=True (activation checkpointing): its recomputed forward is "
        "invisible to dprc's per-sample hooks; set gradient_checkpointing=False (TRL's "
        "SFTConfig turns it on by default)",
    )
    refuse(
        args.auto_find_batch_size,
        "auto_find_batch_size: it changes the batch size, hence the sample rate the privacy was "
        "planned for; set auto_find_batch_size=False",
    )
    refuse(
        args.dataloader_drop_last,
        "dataloader_drop_last: Poisson batches are never cut; dropping examples changes the "
        "sampling; set dataloader_drop_last=False",
    )
    refuse(
        args.ignore_data_skip,
        "ignore_data_skip: a resumed run would redraw the batches of the steps already run, "
        "which were not accounted twice; set ignore_data_skip=False",
    )
    refuse(
        args.label_smoothing_factor > 0,
        f"label_smoothing_factor={args.label_smoothing_factor}: the per-sample loss is plain "
        "cross-entropy, smoothing would silently not happen; set label_smoothing_factor=0",
    )
    refuse(
        str(args.optim).lower().endswith("lomo"),
        f"optim={args.optim}: LOMO optimizers update inside the backward, before the noise; "
        "choose another optim (e.g. adamw_torch)",
    )
    refuse(
        args.push_to_hub,
        "push_to_hub: Trainer checkpoints hold the noise generator's state (dprc_private/); "
        "set push_to_hub=False and upload the model written by save_model yourself",
    )
    return reasons


def _input_refusals(cls: type, inputs: Mapping[str, Any]) -> list[str]:
    """The refusals decided by the trainer's class and its inputs (``args``, ``model_init``,
    ``train_dataset``, ``data_collator``, ``compute_loss_func``): every reason at once."""
    reasons: list[str] = []
    args = inputs.get("args")
    if args is not None:
        reasons += _args_refusals(args)
    for name in ("_get_train_sampler", "get_train_dataloader", "training_step"):
        if getattr(cls, name) is not getattr(DPTrainer, name):
            reasons.append(
                f"{cls.__name__} overrides {name}: the training batches must be DPTrainer's "
                "Poisson batches and each micro-batch must go through the engine; remove the "
                "override (a model's own loss goes in per_sample_loss=fn)"
            )
    if inputs.get("model_init") is not None:
        reasons.append(
            "model_init: the privacy plan and the engine are made for the model given; pass "
            "model= instead"
        )
    if inputs.get("compute_loss_func") is not None:
        reasons.append(
            "compute_loss_func: DP training needs one loss per example and would silently not "
            "use it; pass per_sample_loss=fn (fn(model, batch) -> Tensor[B]) instead"
        )
    dataset = inputs.get("train_dataset")
    if dataset is not None and (
        isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__")
    ):
        reasons.append(
            "an iterable (unsized) train_dataset: Poisson sampling needs the N examples "
            "indexable; pass a map-style data set (e.g. a datasets.Dataset, not streaming)"
        )
    collator = inputs.get("data_collator")
    if type(collator).__name__ == "DataCollatorWithFlattening" or bool(
        getattr(collator, "padding_free", False)
    ):
        reasons.append(
            f"data collator {type(collator).__name__} flattens examples into one row (padding "
            "free): a row must be one example, the unit of privacy; use a padding collator"
        )
    return reasons


def _refusals(trainer: Trainer) -> list[str]:
    """Every reason this built Trainer cannot be run privately (empty: fine)."""
    reasons = cast(Any, trainer)._input_refusals(
        {
            "args": trainer.args,
            "model_init": trainer.model_init,
            "compute_loss_func": trainer.compute_loss_func,
            "train_dataset": trainer.train_dataset,
            "data_collator": getattr(trainer, "data_collator", None),
        }
    )
    if trainer.is_fsdp_enabled and not trainer.args.fsdp:
        reasons.append("FSDP (enabled by the accelerate config): not supported; turn it off")
    return reasons


def _refuse(cls: type, reasons: list[str]) -> None:
    if reasons:
        raise DPTrainerError(f"{cls.__name__} refuses this setup:\n- " + "\n- ".join(reasons))


# --------------------------------------------------------------------------- data
class _EpochClock:
    """Epochs as the plan counts them: epoch e ends after ``planned_steps(N, B, e)`` steps (the
    plan of e epochs), so the Trainer's epoch boundaries are ⌈e·N/B⌉ (every ⌈N/B⌉ steps when B
    divides N; ν-DP-FTRL: every ⌈N/B⌉ steps). The last epoch ends at the plan's last step, so
    the epochs run exactly the planned steps."""

    def __init__(self, plan: PrivacyPlan):
        n, b, noise = plan.dataset_size, plan.batch_size, plan.noise
        self.full_ends: list[int] = []  # where whole epochs 1, 2, ... end
        while not self.full_ends or self.full_ends[-1] < plan.steps:
            epochs = len(self.full_ends) + 1
            self.full_ends.append(noise.steps(n, b, epochs))  # the mechanism's step rule
        self.ends = [*self.full_ends[:-1], plan.steps]  # the epochs that run
        self._ends = frozenset(self.ends)
        starts = [0, *self.ends[:-1]]
        self.longest = max(end - start for start, end in zip(starts, self.ends, strict=True))

    @property
    def epochs(self) -> int:
        return len(self.ends)

    def is_end(self, steps: int) -> bool:
        """Whether an epoch ends after ``steps`` steps."""
        return steps in self._ends

    def index(self, step: int) -> int:
        """The 0-based epoch that step ``step + 1`` belongs to (= epochs completed)."""
        return bisect.bisect_right(self.ends, step)

    def end(self, step: int) -> int:
        """The last step of the epoch that step ``step + 1`` belongs to."""
        return self.ends[min(self.index(step), self.epochs - 1)]

    def epoch_at(self, steps: int) -> float:
        """Epochs done after ``steps`` steps: e at the end of epoch e, linear in between."""
        i = bisect.bisect_left(self.full_ends, steps)
        if i >= len(self.full_ends):
            return float(len(self.full_ends))
        before = self.full_ends[i - 1] if i else 0
        return i + (steps - before) / (self.full_ends[i] - before)


def _user_keys(dataset: Any, field_name: str) -> torch.Tensor:
    """Each row's user key (``token_store.user_key`` of the id in column ``field_name``)."""
    names = getattr(dataset, "column_names", None)
    if names is not None:  # a Hugging Face Dataset: the column at once
        if field_name not in names:
            raise DPTrainerError(
                f"unit='user': the train_dataset has no column {field_name!r} (user_field) "
                f"naming each row's user; its columns: {names}"
            )
        ids = list(dataset[field_name])
    else:
        ids = []
        for i in range(len(dataset)):
            row = dataset[i]
            if not isinstance(row, Mapping) or field_name not in row:
                raise DPTrainerError(f"unit='user': row {i} has no {field_name!r} (user_field)")
            ids.append(row[field_name])
    first_type: tuple[int, type] | None = None
    for i, u in enumerate(ids):
        if isinstance(u, bool) or not isinstance(u, (str, int)) or u == "":
            raise DPTrainerError(
                f"unit='user': row {i}'s {field_name!r} must be a non-empty string or an "
                f"integer, got {u!r}"
            )
        kind = str if isinstance(u, str) else int
        if first_type is None:
            first_type = (i, kind)
        elif kind is not first_type[1]:
            raise DPTrainerError(
                f"unit='user': row {i}'s {field_name!r} is {u!r}, of another type than row "
                f"{first_type[0]}'s: a data set's user ids are all strings or all integers "
                '(7 and "7" would be one user, and two people merged into one unit are not '
                "protected: docs/privacy_unit.md)"
            )
    keys = np.asarray([user_key(str(u)) for u in ids], dtype=np.int64)
    hashes = np.frombuffer(b"".join(user_id_hash(str(u)) for u in ids), dtype=np.uint64)
    n_ids, n_keys, _ = count_user_ids(keys, hashes.reshape(-1, 2))
    try:
        check_user_keys(n_ids, n_keys)
    except DataError as exc:
        raise DPTrainerError(f"unit='user': {exc}") from None
    return torch.from_numpy(keys)


class _PoissonMicroBatches(torch.utils.data.Sampler[list[int]]):
    """The batch sampler of the training loader: for each step of the current Trainer epoch, a
    Poisson batch (or ν-DP-FTRL's fixed-order batch) split into ``micro_batches`` consecutive
    index lists.

    Step s's batch is drawn from its own seed (derived from the DP seed and s), so an iteration
    can start at any step: it starts at the Trainer's global step when iteration begins (read
    then: a resumed trainer has restored its seed and step) and ends with the epoch (see
    :class:`_EpochClock`). Its length is the longest epoch's (the Trainer's steps per epoch)."""

    def __init__(
        self,
        n: int,
        plan: PrivacyPlan,
        micro_batches: int,
        seed: Callable[[], int],
        step: Callable[[], int],
        clock: _EpochClock,
        users: tuple[UserIndex, torch.Tensor, int] | None = None,
    ):
        self.n, self.plan, self.micro_batches = n, plan, micro_batches
        self._seed, self._step, self.clock = seed, step, clock
        self.users = users  # unit='user': (rows by user, each row's user key, m)
        self.batch_size = max(1, round(plan.batch_size / micro_batches))  # nominal, for logs

    def __len__(self) -> int:
        return self.clock.longest * self.micro_batches

    def batches(self, seed: int) -> Callable[[int], torch.Tensor]:
        """step (0-based) -> that step's example indices, for the DP seed ``seed``."""
        if self.plan.noise.sampling == "fixed_order":
            order = FixedOrderSampler(
                self.n,
                int(self.plan.batch_size),
                steps=self.plan.steps,
                seed=derive_seed(seed, "sampler"),
            )
            return order.batch
        n, q = self.n, self.plan.sample_rate
        if self.users is not None:
            index, _, m = self.users

            def users(step: int) -> torch.Tensor:
                seed_s = derive_seed(seed, "sampler-step", step)
                return next(iter(UserPoissonSampler(index, q, 1, m, seed=seed_s)))

            return users

        def poisson(step: int) -> torch.Tensor:
            return next(iter(PoissonSampler(n, q, 1, seed=derive_seed(seed, "sampler-step", step))))

        return poisson

    def __iter__(self) -> Iterator[list[int]]:
        batch, start = self.batches(self._seed()), self._step()
        for step in range(start, self.clock.end(start)):
            rows = batch(step)
            if self.users is not None:  # micro-batches cut between users
                parts = split_between_users(rows, self.users[1][rows], self.micro_batches)
            else:
                parts = list(torch.tensor_split(rows, self.micro_batches))
            yield from (c.tolist() for c in parts)


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


class _EpochBoundaries(TrainerCallback):
    """Ends each Trainer epoch where the plan's epoch ends (:class:`_EpochClock`) and keeps
    ``state.epoch`` in the plan's epochs, never above ``num_train_epochs``."""

    def __init__(self, trainer: DPTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        state.epoch = t.epoch_after(state.global_step)
        if t.epoch_clock.is_end(state.global_step):
            control.should_epoch_stop = True  # on_epoch_end: the per-epoch eval / log / save
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
        # every refusal the constructor's inputs decide, at once and before the parent's
        # __init__ (which may tokenize the data: TRL's SFTTrainer does)
        _refuse(type(self), self._input_refusals(self._constructor_inputs(args, kwargs)))
        super().__init__(*args, **kwargs)
        self.privacy_args = privacy_args
        _refuse(type(self), _refusals(self))  # what the parent built (collator, data set)
        if self.args.fp16:
            # dprc forms the clipped sums itself (no loss.backward): a loss scaler would unscale
            # gradients it never scaled. fp16 autocast runs without loss scaling.
            self.accelerator.scaler = None
        self.per_sample_loss = per_sample_loss or default_per_sample_loss(self.dp_model)
        self.dp_seed = privacy_args.dp_seed if privacy_args.dp_seed is not None else fresh_seed()
        self._eps: dict[int, float] = {}
        # unit='user': each row's user key, and the rows grouped by user
        self.user_keys: torch.Tensor | None = None
        self.users: UserIndex | None = None
        if privacy_args.unit == "user":
            self.user_keys = _user_keys(self.train_dataset, privacy_args.user_field)
            self.users = UserIndex.of(self.user_keys)
        self.plan, self.clipping = self._plan()
        # a plan whose steps cannot carry the signal through the noise, or too few steps: one
        # LearnabilityWarning that names the numbers (dprc_core.training.learnability)
        lr, adaptive = self._learning_rate_and_kind()
        warn_if_unlearnable(
            self.plan,
            lr,
            adaptive=adaptive,
            batch_setting="per_device_train_batch_size · gradient_accumulation_steps",
            stacklevel=2,
        )
        self.epoch_clock = _EpochClock(self.plan)
        # the logged epoch never exceeds the epochs asked for (⌈E·N/B⌉ may round past E·N/B)
        self._epoch_cap = self.args.num_train_epochs if self.args.max_steps <= 0 else None
        self.args = copy.copy(self.args)  # the user's TrainingArguments stay as given
        self.args.max_steps = self.plan.steps  # the loop runs exactly the planned steps
        self.allowed_steps = self._steps_within_max_epsilon()
        self.stop_reason: str | None = None
        self.engine: PrivacyEngine | None = None
        self.last_step_stats: StepStats | None = None
        self.add_callback(_StopBeforeMaxEpsilon(self))
        self.add_callback(_EpochBoundaries(self))

    def _constructor_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The parent ``__init__``'s arguments by name (empty where they do not bind: the
        parent then raises its own error)."""
        try:
            bound = inspect.signature(super().__init__).bind_partial(*args, **kwargs)
        except TypeError:
            return {}
        inputs = dict(bound.arguments)
        if "args" in inputs and inputs["args"] is None:
            del inputs["args"]
        if "args" not in inputs:
            inputs["args_missing"] = True
        return inputs

    def _input_refusals(self, inputs: Mapping[str, Any]) -> list[str]:
        """Every refusal the trainer's inputs decide (see :func:`_input_refusals`); a subclass
        adds its own (DPSFTTrainer: TRL's settings)."""
        reasons = _input_refusals(type(self), inputs)
        if inputs.get("args_missing"):
            reasons.insert(0, self._missing_args_reason)
        return reasons

    _missing_args_reason = (
        "no args: the default TrainingArguments clip globally (max_grad_norm=1.0); pass "
        "args=TrainingArguments(output_dir=..., max_grad_norm=0)"
    )

    def _learning_rate_and_kind(self) -> tuple[float | None, bool]:
        """The peak learning rate and whether the optimizer is adaptive (Adam-like): from an
        optimizer passed in ``optimizers=``, else from ``TrainingArguments``."""
        given = getattr(self, "optimizer", None)
        if isinstance(given, torch.optim.Optimizer):
            lrs = [g.get("lr") for g in given.param_groups]
            lr = max((float(x) for x in lrs if isinstance(x, (int, float))), default=None)
            return lr, is_adaptive(type(given).__name__)
        return float(self.args.learning_rate), is_adaptive(str(self.args.optim))

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
        if self.users is not None:  # user-level DP: N is the users, B the users a step
            n = self.users.num_users
        b = args.per_device_train_batch_size * args.gradient_accumulation_steps
        try:
            mechanism = p.mechanism()
        except ValueError as exc:
            raise DPTrainerError(
                f"noise_mechanism={p.noise_mechanism!r}: {exc} (PrivacyArguments.nu, .bands)"
            ) from None
        fixed_order = mechanism.sampling == "fixed_order"  # whole epochs, integer batches
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
            epochs = _epochs_for_steps(n, b, args.max_steps, fixed_order)
        plan = plan_privacy(
            dataset_size=n,
            batch_size=b,
            epochs=int(epochs) if fixed_order else epochs,
            clipping=clipping,
            k=p.k,
            target_epsilon=p.target_epsilon,
            delta=p.target_delta,
            # σ = 0 has no finite ε: plan the steps, q and δ with σ = 1, then set σ = 0, ε = ∞
            noise_multiplier_value=1.0 if sigma_zero else p.noise_multiplier,
            mechanism=mechanism,
            # nothing sketched (an auto plan of exact layers): nothing drawn per example
            sketch=p.sketch if clipping != "exact" else default_sketch(randomized=False),
            unit=p.unit,
            # the hidden-scale law (None: the current one); none without a hidden scale
            scale_width=p.scale_width if clipping != "exact" else None,
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

    def epoch_after(self, steps: int) -> float:
        """The epoch logged after ``steps`` steps: the plan's epochs done (e at the end of
        epoch e, see :class:`_EpochClock`), never above ``num_train_epochs``."""
        epoch = self.epoch_clock.epoch_at(steps)
        return epoch if self._epoch_cap is None else min(epoch, self._epoch_cap)

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
            field_name = self.privacy_args.user_field
            if self.users is not None and field_name in dataset.column_names:
                dataset = dataset.remove_columns([field_name])  # never shown to the model
        else:
            collate = self._get_collator_with_removed_columns(collate, description="training")
        batches = _PoissonMicroBatches(
            len(cast(Any, dataset)),  # sized: an unsized train_dataset is refused
            self.plan,
            self.args.gradient_accumulation_steps,
            lambda: self.dp_seed,
            lambda: self.state.global_step,
            self.epoch_clock,
            self._user_sampling(),
        )
        loader = torch.utils.data.DataLoader(
            _Indexed(dataset),
            batch_sampler=batches,
            collate_fn=_ExampleCollator(collate, dataset),
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def _user_sampling(self) -> tuple[UserIndex, torch.Tensor, int] | None:
        """unit='user': the rows grouped by user, each row's user key, and m."""
        if self.users is None or self.user_keys is None:
            return None
        m = self.privacy_args.max_examples_per_user
        if m is None:
            m = min(DEFAULT_EXAMPLES_PER_USER, self.args.per_device_train_batch_size)
        return self.users, self.user_keys, m

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        raise DPTrainerError("DPTrainer samples its batches itself (Poisson)")

    # -- the loop: the plan's steps, in the plan's epochs
    def train(self, *args: Any, **kwargs: Any) -> TrainOutput:
        """``Trainer.train``, once per DPTrainer: a second call is refused (see
        :meth:`_refuse_second_train`)."""
        self._refuse_second_train()
        return super().train(*args, **kwargs)

    def _refuse_second_train(self) -> None:
        engine = self.engine
        if engine is None:
            return
        eps = self.epsilon_at(engine.steps)
        raise DPTrainerError(
            f"this DPTrainer has trained already: its engine ran {engine.steps} of the "
            f"{self.plan.steps} planned steps (ε={eps:.4g} at δ={self.plan.delta:g}). A second "
            "train() would run the plan's steps again on the same private data, spending "
            "privacy the plan did not account for, so it is refused. To train longer, plan it "
            "from the start in a new DPTrainer (more num_train_epochs or max_steps; σ is "
            "calibrated for the whole run); to continue an interrupted run, build a new "
            "DPTrainer with the same settings and call train(resume_from_checkpoint=...). A "
            "new run on the same data spends privacy of its own: the total is the "
            "composition of both runs' ledgers (privacy_ledger.json; PrivacyLedger([*first."
            "events, *second.events]).epsilon(delta)), never the second run's ε alone"
        )

    def set_initial_training_values(self, args: Any, dataloader: Any) -> Any:
        # the Trainer's epochs are the plan's (the loader's length is the longest epoch)
        values = list(super().set_initial_training_values(args, dataloader))
        values[0] = self.epoch_clock.epochs  # num_train_epochs
        return tuple(values)

    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        # on resume: the epoch by the plan's boundaries, and no batch to skip (the loader
        # starts at the restored global step)
        super()._init_training_state(*args, **kwargs)
        return self.epoch_clock.index(self.state.global_step), 0

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
        observed: list[Any] = []
        observe = self.privacy_args.report_train_loss and self._observes_train_outputs

        def hook(module: Any, args: Any, output: Any) -> None:
            observed.append(self._train_output_stats(batch, output))

        def loss_fn(m: torch.nn.Module, b: Any) -> torch.Tensor:
            if b is not batch:
                return self.per_sample_loss(m, b)
            handle = m.register_forward_hook(hook) if observe else None
            try:
                losses = self.per_sample_loss(m, b)
            finally:
                if handle is not None:
                    handle.remove()
            seen.append(losses.detach())
            return losses

        with self.compute_loss_context_manager():
            if self.user_keys is not None:  # the rows' users: each user's rows clipped together
                if ids is None:
                    raise DPTrainerError("unit='user' needs batches that are mappings")
                engine.accumulate(loss_fn, batch, user_ids=self.user_keys[ids.cpu()])
            else:
                engine.accumulate(loss_fn, batch, None if ids is None else ids.cpu())
        if self.privacy_args.report_train_loss:
            self._record_train_batch(batch, observed[-1] if observed else None)
        total = torch.zeros((), device=self.args.device)
        if seen:
            losses = seen[-1].float()
            total = losses[torch.isfinite(losses)].sum().to(self.args.device)
        return total / self.plan.batch_size

    # what a subclass reports of the training batches (DPSFTTrainer: SFT's token metrics);
    # training-set metrics are not covered by DP: only with PrivacyArguments.report_train_loss
    _observes_train_outputs = False

    def _train_output_stats(self, batch: Any, outputs: Any) -> Any:
        """Statistics of the model's outputs on a training micro-batch (in the forward)."""
        return None

    def _record_train_batch(self, batch: Any, stats: Any) -> None:
        """Record a training micro-batch (and its output statistics) for the logs."""

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        # before the optimizer step the gradients are the clipped sum without its noise: their
        # norm is not private, so it is not logged
        return None

    # -- logs
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        steps = self.state.global_step
        self.state.epoch = self.epoch_after(steps)  # the plan's epochs, never above E
        if not self.privacy_args.report_train_loss:  # computed on the private data, not DP
            for key in _TRAIN_SET_LOGS:
                logs.pop(key, None)
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
        # the arguments as JSON, never the Trainer's pickle of them (no pickle in outputs)
        (out / TRAINING_ARGS_NAME).unlink(missing_ok=True)
        (out / TRAINING_ARGS_JSON).write_text(self.args.to_json_string())
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
        saved, now = state["plan"], json.loads(json.dumps(self.plan.to_dict()))
        if "scale_width" not in saved:  # planned before the law was recorded: on 0.1 %
            saved = {**saved, "scale_width": recorded_scale_width(saved)}
        if saved != now:
            missing = "(absent)"
            differ = [
                f"- {name}: {saved.get(name, missing)!r} in the checkpoint, "
                f"{now.get(name, missing)!r} now"
                for name in sorted(set(saved) | set(now))
                if saved.get(name, missing) != now.get(name, missing)
            ]
            raise DPTrainerError(
                f"the checkpoint {checkpoint} was written for another privacy plan; the plan "
                "fields that differ:\n" + "\n".join(differ) + "\nresume with the settings the "
                "checkpoint was planned with (the same data set, batch size · gradient "
                "accumulation steps, epochs or max_steps and PrivacyArguments; a checkpoint "
                "planned on the hidden-scale law 0.001: PrivacyArguments(scale_width=0.001))"
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


def _epochs_for_steps(n: int, b: int, steps: int, fixed_order: bool) -> float:
    """Epochs whose planned steps (the one step rule) are exactly ``steps`` (fixed order:
    whole epochs of ⌈N/B⌉ steps)."""
    from dprc_core.accounting.steps import planned_steps

    if fixed_order:
        per_epoch = -(-n // b)
        return steps / per_epoch
    epochs = steps * b / n
    for _ in range(64):  # the float nearest steps·b/n may round one step up
        if planned_steps(n, b, epochs) <= steps:
            break
        epochs = math.nextafter(epochs, 0.0)
    return epochs
