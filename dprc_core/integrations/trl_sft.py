"""``DPSFTTrainer``: TRL's ``SFTTrainer`` with DPTrainer's DP-SGD(-RC) steps.

Needs the optional ``trl`` extra (``pip install 'dprc[trl]'``); importing this module without
TRL raises an ImportError that says so. Everything of :class:`DPTrainer` applies (Poisson
batches, noise once per logical batch, ε in the logs, the refusals); in addition SFT's packing
and padding-free collation are refused, because they put several examples into one row and
the unit of privacy is one example (one row), and so is ``loss_type='dft'`` (the DP step's
per-sample loss is plain cross-entropy). Every refusal is raised at once, before TRL prepares
(tokenizes) any data.

The logs carry SFTTrainer's metrics: ``mean_token_accuracy``, ``entropy`` and ``num_tokens``
(training tokens seen so far) in training and evaluation. The training ones are computed on
the private training data in the DP step's own forward and are **not** covered by DP; with
``PrivacyArguments.report_train_loss=False`` they are left out (``eval_num_tokens`` too: it
counts training tokens), as the loss is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

try:
    from trl import SFTTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "DPSFTTrainer needs TRL: install the optional extra, pip install 'dprc[trl]'"
    ) from exc

from dprc_core.integrations.hf_trainer import DPTrainer, DPTrainerError
from dprc_core.losses import IGNORE_INDEX

__all__ = ["DPSFTTrainer", "DPTrainerError"]


def _token_stats(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[valid, correct, Σ entropy] over the next-token positions whose label is not -100:
    SFTTrainer's definitions (the label is the arg max; the entropy of the softmax), one row at
    a time so that no more than one row's log-probabilities are held."""
    out = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for row, target in zip(logits[:, :-1], labels[:, 1:].to(logits.device), strict=True):
            keep = target != IGNORE_INDEX
            if not bool(keep.any()):
                continue
            row = row[keep].float()
            logp = torch.log_softmax(row, dim=-1)
            out[0] += float(keep.sum())
            out[1] += float((row.argmax(dim=-1) == target[keep]).sum())
            out[2] += float(-(logp.exp() * logp).sum())
    return out


class DPSFTTrainer(DPTrainer, SFTTrainer):
    """``trl.SFTTrainer`` whose optimizer steps are DP steps: pass ``privacy_args`` besides
    SFTTrainer's arguments (an ``SFTConfig`` with ``max_grad_norm=0`` and
    ``gradient_checkpointing=False``; ``packing`` and ``padding_free`` stay False)."""

    _missing_args_reason = (
        "no args: TRL's default SFTConfig clips globally (max_grad_norm=1.0) and turns on "
        "gradient checkpointing; pass args=SFTConfig(output_dir=..., max_grad_norm=0, "
        "gradient_checkpointing=False)"
    )
    _observes_train_outputs = True

    def __init__(self, *args: Any, **kwargs: Any):
        self._token_sums = torch.zeros(3, dtype=torch.float64)  # valid, correct, Σ entropy
        super().__init__(*args, **kwargs)

    def _input_refusals(self, inputs: Mapping[str, Any]) -> list[str]:
        reasons = super()._input_refusals(inputs)
        config = inputs.get("args")
        if getattr(config, "packing", False):
            reasons.append(
                "SFTConfig.packing: packing concatenates several examples into one row; a row "
                "must be one example, the unit of privacy; set packing=False"
            )
        if getattr(config, "padding_free", False):
            reasons.append(
                "SFTConfig.padding_free: it flattens the batch's examples into one row; a row "
                "must be one example, the unit of privacy; set padding_free=False"
            )
        loss_type = getattr(config, "loss_type", "nll")
        if loss_type != "nll":
            reasons.append(
                f"SFTConfig.loss_type={loss_type!r}: the DP step's per-sample loss is plain "
                "cross-entropy, so this loss would silently not be trained; set loss_type='nll'"
            )
        return reasons

    # -- SFT's metrics of the training batches (see the module's docstring)
    def _train_output_stats(self, batch: Any, outputs: Any) -> Any:
        logits = getattr(outputs, "logits", None)
        if logits is None or not isinstance(batch, Mapping):
            return None
        labels = batch.get("labels")
        if labels is None:  # as causal_lm_per_sample_loss: the inputs, padding ignored
            labels = batch["input_ids"]
            if batch.get("attention_mask") is not None:
                labels = labels.masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        return _token_stats(logits.detach(), labels)

    def _record_train_batch(self, batch: Any, stats: Any) -> None:
        if stats is not None:
            self._token_sums += stats
        if isinstance(batch, Mapping) and batch.get("attention_mask") is not None:
            self._total_train_tokens += int(batch["attention_mask"].sum())
        elif isinstance(batch, Mapping) and batch.get("input_ids") is not None:
            self._total_train_tokens += int(batch["input_ids"].numel())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        train = self.model is not None and self.model.training
        if not self.privacy_args.report_train_loss:
            self._metrics["train"].clear()
            self._metrics["eval"].pop("num_tokens", None)  # it counts the training tokens
        elif train:
            # token-weighted over the logging window (a Poisson micro-batch may be empty)
            valid, correct, entropy = self._token_sums.tolist()
            metrics = self._metrics["train"]
            if valid > 0:
                metrics["mean_token_accuracy"] = [correct / valid]
                metrics["entropy"] = [entropy / valid]
            metrics["num_tokens"] = [float(self._total_train_tokens)]
            self._token_sums.zero_()
        super().log(logs, start_time)
