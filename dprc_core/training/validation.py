"""The validation set of a job: ``valid_loss`` at every checkpoint.

``valid_loss`` is the mean, over every example of the validation file, of the per-example loss
the job trains with (:func:`dprc_core.losses.causal_lm_per_sample_loss` or
:func:`dprc_core.losses.sequence_classification_per_sample_loss`), computed in eval mode
under ``torch.no_grad`` on the checkpoint's weights. It is evaluation only: no gradient, no
noise, no random draw, so the training run (weights, ε, resumes) is the same with or without a
validation file. It is a function of the released (DP) model and of the validation data only,
so it costs the training file no privacy budget; it is *not* private with respect to the
validation file itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from dprc_core.training import token_store
from dprc_core.training.data import Batches, DataError, load_jsonl, tokenize


class ValidationDataError(DataError):
    """A validation file that cannot be used (bad line, an unknown class, nothing to score)."""


def prepare_validation(
    path: str | None,
    task: str,
    tokenizer: Any,
    max_seq_len: int,
    classes: list[str] | None,
    store_root: Path | None = None,
) -> Batches | None:
    """The validation file tokenized as the training data is (same ``max_seq_len``; for
    classification the training file's classes: a label outside them is an error), into a
    store under ``store_root`` (token_store.py) or, without one, in memory."""
    if path is None:
        return None
    data: Batches
    try:
        if store_root is not None:
            data = token_store.open_or_build(
                path, tokenizer, max_seq_len, task, classes, store_root
            )
        else:
            data = tokenize(load_jsonl(path, task), tokenizer, max_seq_len, classes)
    except DataError as exc:
        raise ValidationDataError(f"validation file: {exc}") from exc
    if len(data) == 0:
        raise ValidationDataError("validation file: no examples")
    return data


@torch.no_grad()
def validation_loss(model: torch.nn.Module, data: Batches, task: str, batch_size: int) -> float:
    """Mean per-example loss of ``model`` on the whole of ``data`` (eval mode; the model's
    train/eval mode is restored afterwards)."""
    loss_fn = (
        causal_lm_per_sample_loss
        if task == "causal_lm"
        else (sequence_classification_per_sample_loss)
    )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64)
    try:
        for start in range(0, len(data), batch_size):
            idx = range(start, min(start + batch_size, len(data)))
            batch = {k: v.to(device) for k, v in data.batch(idx).items()}
            total += loss_fn(model, batch).double().sum().cpu()
    finally:
        model.train(was_training)
    return float(total) / len(data)
