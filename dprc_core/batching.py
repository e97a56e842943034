"""Batches as the engine sees them: a tensor, or a dict / tuple / list of tensors, batch-first."""

from __future__ import annotations

from typing import Any

import torch


def batch_size(batch: Any) -> int | None:
    """Leading dimension of the first tensor found in the batch (None if there is none)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return None
    for v in values:
        size = batch_size(v)
        if size is not None:
            return size
    return None


def select_samples(batch: Any, index: torch.Tensor, size: int | None = None) -> Any:
    """The samples ``index`` of a batch: every tensor whose leading dimension is the batch size
    is indexed; everything else (scalars, shared tensors, non-tensors) is passed through."""
    size = batch_size(batch) if size is None else size
    if isinstance(batch, torch.Tensor):
        if batch.dim() > 0 and batch.shape[0] == size:
            return batch[index.to(batch.device)]
        return batch
    if isinstance(batch, dict):
        return type(batch)({k: select_samples(v, index, size) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(select_samples(v, index, size) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(select_samples(v, index, size) for v in batch)
    return batch
