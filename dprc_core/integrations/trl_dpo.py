"""``DPDPOTrainer``: TRL's ``DPOTrainer`` with DPTrainer's DP-SGD(-RC) steps, the privacy unit
one preference pair.

Needs the optional ``trl`` extra (``pip install 'dprc[trl]'``). Everything of :class:`DPTrainer`
applies (Poisson batches, noise once per logical batch, ε in the logs, the refusals). TRL
prepares the data as it does for ``DPOTrainer`` (prompt / chosen / rejected, its tokenization,
EOS, truncation) and computes the reference log-probabilities **once, before training**
(``DPOConfig(precompute_ref_log_probs=True)``, required): from the model itself (no second copy
is kept), from ``ref_model`` if one is given (it must be public: it is not accounted for), and
for a peft model with its adapters disabled when TRL builds it from ``peft_config=`` — with a
``PeftModel`` passed in, TRL's own frozen copy of its adapter as given (its "ref" adapter; the
base model for a fresh LoRA). Only parameters of the policy are trained and noised.

The DP step (how it differs from TRL's, and why). TRL collates a batch of P pairs into 2P rows
``[chosen; rejected]`` and averages its loss over the batch with one backward, so a pair is two
rows far apart. Here the training collator reshapes TRL's collated batch into the pair layout
of :mod:`dprc_core.preference` — ``input_ids``, ``attention_mask``, ``labels`` (P, 2, T), ``[:,
0]`` chosen, ``[:, 1]`` rejected, ``labels`` the completion tokens and -100 elsewhere, and
``ref_logps`` (P, 2) — so that a pair is one sample of the engine: one Poisson draw (the pair's
prompt, both answers and which one was preferred enter or leave the batch together), one
gradient through both sequences, clipped once with the engine's norms. The per-pair loss is
``dprc_core.preference.dpo_loss(beta)``, TRL's ``loss_type="sigmoid"`` (equal to TRL's
``_compute_loss`` on the same pairs). It is computed from the model's ordinary forward (the
logits), not from TRL's fused LM head (``add_fused_lm_head``): the fused head multiplies the
hidden states by ``lm_head.weight`` inside one autograd Function, out of reach of the engine's
per-sample hooks on ``lm_head``. Evaluation is TRL's own (its collated layout and fused head),
so ``eval_*`` metrics are DPOTrainer's.

Refused at construction (with the parent's refusals, all at once, before TRL tokenizes), each
because the DP step could not honour it: ``loss_type`` other than ``["sigmoid"]`` (and
``loss_weights`` other than ``[1.0]``), ``f_divergence_type`` other than ``"reverse_kl"``,
``ld_alpha``, ``use_weighting`` (WPO weights: the DP step's loss is the plain sigmoid loss, so
these would silently not be trained); ``padding_free`` (it flattens pairs into one row: a pair
must stay one unit); ``precompute_ref_log_probs=False`` and ``sync_ref_model`` (the reference
must be fixed and computed before training: a reference forward at each step on a moving or
second model is not what the DP step computes); ``activation_offloading`` (TRL applies it in
its ``training_step``, which the DP step replaces); a ``router_aux_loss_coef`` / a
mixture-of-experts auxiliary loss (not in the per-pair loss); a vision data set (the pair
collator is text only); ``per_sample_loss`` (the loss is the pair loss). TRL's ``aot`` losses,
which sort the batch's pairs against each other (mixing pairs), are among the refused
``loss_type`` values.

The logs carry DPOTrainer's reward metrics, computed from the DP step's own forward of the
training pairs (pair-weighted over the logging window): ``rewards/chosen``,
``rewards/rejected`` (β·(log π − log π_ref) of each answer), ``rewards/accuracies`` (the share
of pairs whose chosen reward is the larger), ``rewards/margins``, ``logps/chosen``,
``logps/rejected`` and ``num_tokens``. They are computed on the private training data and are
**not** covered by DP; with ``PrivacyArguments.report_train_loss=False`` they are left out (and
``eval_num_tokens``, which counts training tokens), as the loss is. TRL's other training
metrics (entropy, mean logits, token accuracy) come from its fused head and are not logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

try:
    from trl import DPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "DPDPOTrainer needs TRL: install the optional extra, pip install 'dprc[trl]'"
    ) from exc

from dprc_core.integrations.hf_trainer import DPTrainer, DPTrainerError
from dprc_core.losses import IGNORE_INDEX
from dprc_core.preference import dpo_loss

__all__ = ["DPDPOTrainer", "DPTrainerError", "pairs_from_trl", "trl_from_pairs"]

_TRL_KEYS = frozenset(
    {"input_ids", "attention_mask", "completion_mask", "ref_chosen_logps", "ref_rejected_logps"}
)
# the training metrics, in the order of the sums kept (after the pair count)
_REWARD_KEYS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


def pairs_from_trl(batch: Mapping[str, Any]) -> dict[str, Any]:
    """TRL's collated preference batch (2P rows, ``[chosen; rejected]``, ``completion_mask``,
    ``ref_chosen_logps`` / ``ref_rejected_logps``) as :mod:`dprc_core.preference`'s pair layout:
    ``input_ids``, ``attention_mask``, ``labels`` (P, 2, T), ``ref_logps`` (P, 2)."""
    unknown = set(batch) - _TRL_KEYS
    if unknown:
        raise DPTrainerError(
            f"the preference collator returned keys {sorted(unknown)} that DPDPOTrainer cannot "
            "place in a pair (expected TRL's DataCollatorForPreference output)"
        )
    for key in ("input_ids", "completion_mask", "ref_chosen_logps", "ref_rejected_logps"):
        if key not in batch:
            raise DPTrainerError(
                f"the preference batch has no {key!r}: DPDPOTrainer needs TRL's collated pairs "
                "with reference log-probs computed before training (precompute_ref_log_probs)"
            )
    ids = batch["input_ids"]
    rows = ids.shape[0]
    p = batch["ref_chosen_logps"].shape[0]
    if rows != 2 * p:
        raise DPTrainerError(f"{rows} rows for {p} pairs: TRL's layout is [chosen; rejected]")

    def pair(x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:p], x[p:]], dim=1)

    labels = ids.masked_fill(batch["completion_mask"] == 0, IGNORE_INDEX)
    out = {"input_ids": pair(ids), "labels": pair(labels)}
    if batch.get("attention_mask") is not None:
        out["attention_mask"] = pair(batch["attention_mask"])
    out["ref_logps"] = torch.stack([batch["ref_chosen_logps"], batch["ref_rejected_logps"]], 1)
    return out


def trl_from_pairs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`pairs_from_trl` (a batch already in TRL's layout is returned as
    is): for TRL's evaluation and reference passes."""
    ids = batch.get("input_ids")
    if ids is None or ids.dim() != 3:
        return dict(batch)

    def flat(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, 0], x[:, 1]])

    out = {
        "input_ids": flat(ids),
        "completion_mask": flat((batch["labels"] != IGNORE_INDEX).long()),
        "ref_chosen_logps": batch["ref_logps"][:, 0],
        "ref_rejected_logps": batch["ref_logps"][:, 1],
    }
    if batch.get("attention_mask") is not None:
        out["attention_mask"] = flat(batch["attention_mask"])
    return out


class _PairCollator:
    """TRL's preference collator, its output reshaped into pairs (one row of the batch = one
    pair = one privacy unit)."""

    def __init__(self, collate: Callable[[list[Any]], Any]):
        self.collate = collate

    def __call__(self, examples: list[Any]) -> dict[str, Any]:
        return pairs_from_trl(dict(self.collate(examples)))


def _pair_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(R,) the summed log-probabilities of each row's label tokens (``labels[:, 1:]`` the
    targets of ``logits[:, :-1]``), one row at a time."""
    out = torch.zeros(labels.shape[0], dtype=torch.float64)
    with torch.no_grad():
        for i, (row, target) in enumerate(zip(logits[:, :-1], labels[:, 1:], strict=True)):
            keep = target != IGNORE_INDEX
            if bool(keep.any()):
                logp = torch.log_softmax(row[keep].double(), dim=-1)
                out[i] = logp.gather(-1, target[keep].unsqueeze(-1)).sum()
    return out


class DPDPOTrainer(DPTrainer, DPOTrainer):
    """``trl.DPOTrainer`` whose optimizer steps are DP steps, one preference pair one privacy
    unit: pass ``privacy_args`` besides DPOTrainer's arguments (a ``DPOConfig`` with
    ``max_grad_norm=0``, ``gradient_checkpointing=False`` and
    ``precompute_ref_log_probs=True``; ``loss_type`` the default ``sigmoid``)."""

    _missing_args_reason = (
        "no args: TRL's default DPOConfig clips globally (max_grad_norm=1.0), turns on gradient "
        "checkpointing and computes the reference at every step; pass args=DPOConfig("
        "output_dir=..., max_grad_norm=0, gradient_checkpointing=False, "
        "precompute_ref_log_probs=True)"
    )
    _observes_train_outputs = True

    def __init__(self, *args: Any, **kwargs: Any):
        self._pair_sums = torch.zeros(1 + len(_REWARD_KEYS), dtype=torch.float64)
        self._dpo_loss: Callable[[nn.Module, Any], torch.Tensor] | None = None
        if "per_sample_loss" in kwargs:
            raise DPTrainerError(
                "DPDPOTrainer refuses per_sample_loss: its per-pair loss is TRL's sigmoid DPO "
                "loss (dprc_core.preference.dpo_loss)"
            )
        super().__init__(*args, per_sample_loss=self._pair_loss, **kwargs)
        # the training batches in pairs; TRL's own layout stays for its reference and eval passes
        self.data_collator = _PairCollator(self.data_collator)

    def _pair_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        if self._dpo_loss is None:
            self._dpo_loss = dpo_loss(self.beta)
        return self._dpo_loss(model, batch)

    def _input_refusals(self, inputs: Mapping[str, Any]) -> list[str]:
        reasons = super()._input_refusals(inputs)
        config = inputs.get("args")
        if config is not None:
            reasons += _dpo_config_refusals(config)
        if getattr(self, "aux_loss_enabled", False):  # known once the parent has seen the model
            reasons.append(
                "a mixture-of-experts model with a router auxiliary loss: the DP step's per-pair "
                "loss does not include it; set router_aux_loss_coef=0"
            )
        if getattr(self, "_is_vision_dataset", False):
            reasons.append(
                "a vision data set (images): the pair collator handles text only; use a text "
                "preference data set"
            )
        return reasons

    # -- TRL's reference and evaluation passes read its own layout
    def compute_ref_log_probs(self, model: Any, inputs: Any) -> Any:
        return super().compute_ref_log_probs(model, trl_from_pairs(inputs))

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> Any:
        return super().prediction_step(
            model, trl_from_pairs(inputs), prediction_loss_only, ignore_keys
        )

    # -- DPO's reward metrics of the training pairs (see the module's docstring)
    def _train_output_stats(self, batch: Any, outputs: Any) -> Any:
        logits = getattr(outputs, "logits", None)
        if logits is None or not isinstance(batch, Mapping) or batch["labels"].shape[0] == 0:
            return None
        labels = batch["labels"]
        logps = _pair_logps(logits.detach(), labels.reshape(-1, labels.shape[-1]).to(logits.device))
        logps = logps.reshape(-1, 2)
        ref = batch["ref_logps"].detach().to("cpu", torch.float64)
        rewards = self.beta * (logps - ref)
        chosen, rejected = rewards[:, 0], rewards[:, 1]
        return torch.stack(
            [
                torch.tensor(float(logps.shape[0]), dtype=torch.float64),
                chosen.sum(),
                rejected.sum(),
                (chosen > rejected).double().sum(),
                (chosen - rejected).sum(),
                logps[:, 0].sum(),
                logps[:, 1].sum(),
            ]
        )

    def _record_train_batch(self, batch: Any, stats: Any) -> None:
        if stats is not None:
            self._pair_sums += stats
        if isinstance(batch, Mapping) and batch.get("attention_mask") is not None:
            self._total_train_tokens += int(batch["attention_mask"].sum())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        train = self.model is not None and self.model.training
        if not self.privacy_args.report_train_loss:
            self._metrics["train"].clear()
            self._metrics["eval"].pop("num_tokens", None)  # it counts the training tokens
        elif train:
            metrics = self._metrics["train"]
            pairs, *sums = self._pair_sums.tolist()
            if pairs > 0:
                for key, total in zip(_REWARD_KEYS, sums, strict=True):
                    metrics[key] = [total / pairs]
            metrics["num_tokens"] = [float(self._total_train_tokens)]
            self._pair_sums.zero_()
        super().log(logs, start_time)


def _dpo_config_refusals(config: Any) -> list[str]:
    """The DPOConfig settings the DP step cannot honour, each with the setting to change."""
    reasons: list[str] = []
    loss_type = getattr(config, "loss_type", ["sigmoid"])
    loss_type = [loss_type] if isinstance(loss_type, str) else list(loss_type)
    if loss_type != ["sigmoid"]:
        reasons.append(
            f"DPOConfig.loss_type={loss_type!r}: the DP step's per-pair loss is the sigmoid DPO "
            "loss, so another loss would silently not be trained (and 'aot' sorts the batch's "
            "pairs against each other, mixing units); set loss_type='sigmoid'"
        )
    weights = getattr(config, "loss_weights", None)
    if weights is not None and list(weights) != [1.0]:
        reasons.append(
            f"DPOConfig.loss_weights={weights!r}: the DP step's loss is the unweighted sigmoid "
            "loss; set loss_weights=None"
        )
    f_div = getattr(config, "f_divergence_type", "reverse_kl")
    if f_div != "reverse_kl":
        reasons.append(
            f"DPOConfig.f_divergence_type={f_div!r}: the DP step's loss is standard DPO; set "
            "f_divergence_type='reverse_kl'"
        )
    if getattr(config, "ld_alpha", None) is not None:
        reasons.append(
            "DPOConfig.ld_alpha: the DP step's log-probabilities are summed over the whole "
            "answer; set ld_alpha=None"
        )
    if getattr(config, "use_weighting", False):
        reasons.append(
            "DPOConfig.use_weighting: WPO weights are not in the DP step's loss; set "
            "use_weighting=False"
        )
    if getattr(config, "padding_free", False):
        reasons.append(
            "DPOConfig.padding_free: it flattens the batch's sequences into one row; a pair "
            "must stay one unit of privacy; set padding_free=False"
        )
    if not getattr(config, "precompute_ref_log_probs", False):
        reasons.append(
            "DPOConfig.precompute_ref_log_probs=False: the DP step reads reference "
            "log-probabilities computed once before training (no reference forward per step); "
            "set precompute_ref_log_probs=True"
        )
    if getattr(config, "sync_ref_model", False):
        reasons.append(
            "DPOConfig.sync_ref_model: the reference must stay fixed (it is computed once, "
            "before training); set sync_ref_model=False"
        )
    if getattr(config, "activation_offloading", False):
        reasons.append(
            "DPOConfig.activation_offloading: TRL applies it in its training_step, which the DP "
            "step replaces; set activation_offloading=False"
        )
    if getattr(config, "router_aux_loss_coef", None):
        reasons.append(
            f"DPOConfig.router_aux_loss_coef={config.router_aux_loss_coef}: a mixture-of-experts "
            "auxiliary loss is not in the DP step's per-pair loss; set router_aux_loss_coef=None"
        )
    return reasons
