"""Per-sample loss helpers: ``loss_fn(model, batch) -> Tensor[B]``.

The privacy unit is one example (one sequence). Padding positions (``attention_mask == 0``) and
labels equal to ``-100`` never contribute to a sample's loss, hence to its gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
_MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise ValueError("batch must be a mapping with at least 'input_ids'")
    return {k: batch[k] for k in _MODEL_KEYS if k in batch and batch[k] is not None}


def _loss_dtype(logits: torch.Tensor) -> torch.Tensor:
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def causal_lm_per_sample_loss(
    model: nn.Module, batch: Mapping[str, Any], reduction: str = "mean"
) -> torch.Tensor:
    """Next-token cross-entropy per sequence, over non-padding target tokens only.

    ``labels`` default to ``input_ids`` with padding positions set to -100. ``reduction``:
    ``"mean"`` (average over the sample's counted tokens) or ``"sum"``.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    inputs = _model_inputs(batch)
    labels = batch.get("labels")
    if labels is None:
        labels = inputs["input_ids"].clone()
        mask = inputs.get("attention_mask")
        if mask is not None:
            labels = labels.masked_fill(mask == 0, IGNORE_INDEX)
    logits = _loss_dtype(model(**inputs).logits)
    logits, targets = logits[:, :-1], labels[:, 1:]
    tok = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).reshape(targets.shape)
    total = tok.sum(1)
    if reduction == "sum":
        return total
    counts = (targets != IGNORE_INDEX).sum(1).clamp(min=1)
    return total / counts.to(total.dtype)


def sequence_classification_per_sample_loss(
    model: nn.Module, batch: Mapping[str, Any]
) -> torch.Tensor:
    """Cross-entropy of a sequence-classification head, one value per sequence."""
    if "labels" not in batch:
        raise ValueError("batch must contain 'labels' for sequence classification")
    logits = _loss_dtype(model(**_model_inputs(batch)).logits)
    return F.cross_entropy(logits, batch["labels"], reduction="none")
