"""Direct preference optimisation (DPO) under DP: a loss whose privacy unit is one preference
pair, and the reference log-probabilities it needs.

Two batch layouts; in both, ``labels`` hold the answer's tokens and −100 elsewhere (prompt,
padding), with the convention of :func:`dprc_core.losses.causal_lm_per_sample_loss`
(``labels[:, 1:]`` are the targets of ``logits[:, :-1]``), and ``ref_logps`` the reference
policy's log π_ref(y|x), summed over the answer's tokens (:func:`reference_logps`), computed
once before training.

* **Pairs** (recommended): ``input_ids``, ``attention_mask``, ``labels`` of shape (P, 2, T),
  ``[:, 0]`` the chosen answer and ``[:, 1]`` the rejected one, ``ref_logps`` (P, 2). The loss
  returns (P,): a pair is one sample of the engine (``engine.accumulate(dpo_loss(β), batch)``,
  example-level DP with the pair as the example), so it is clipped once, cannot be split, and
  the engine's per-sample independence check runs on whole pairs.
* **Rows**: (B, T) tensors, one row per answer, with ``pair`` (B,) the pair id of each row
  (each id exactly twice in the micro-batch), ``chosen`` (B,) bool (one of a pair's rows) and
  ``ref_logps`` (B,). Each row gets half its pair's loss, so the rows sum to Σ_pairs L and a
  pair's two rows together have gradient ∇L_pair; pass ``user_ids=batch["pair"]`` so that the
  engine clips each pair once. A pair with one row in the micro-batch is refused here, a pair
  met in two micro-batches of a logical batch by the engine (a unit met twice). The engine's
  independence check compares single *rows*, which a pair's rows fail by design: this layout
  needs ``Clipping(..., check_independence=False)`` until the check runs per unit.

The loss of a pair is ``L = −log σ(β·[(log π(y⁺|x) − log π_ref(y⁺|x)) − (log π(y⁻|x) −
log π_ref(y⁻|x))])`` (TRL's ``loss_type="sigmoid"``). The privacy unit is the pair: its prompt,
both answers and which one was preferred.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dprc_core.losses import IGNORE_INDEX, _loss_dtype, _model_inputs

PAIR_KEYS = ("labels", "pair", "chosen")
DEFAULT_BETA = 0.1  # β when none is given: TRL's DPOConfig default


def sequence_logps(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """(B,) log π(y|x) of each row: the log-probabilities of its ``labels`` tokens (≠ −100),
    summed, with ``labels[:, 1:]`` the targets of ``logits[:, :-1]``."""
    if "labels" not in batch:
        raise ValueError("a preference batch needs 'labels': the answer's tokens, -100 elsewhere")
    labels = batch["labels"]
    logits = _loss_dtype(model(**_model_inputs(batch)).logits)[:, :-1]
    targets = labels[:, 1:]
    counted = targets != IGNORE_INDEX
    logp = torch.log_softmax(logits, dim=-1)
    tok = logp.gather(-1, targets.masked_fill(~counted, 0).unsqueeze(-1)).squeeze(-1)
    return (tok * counted.to(tok.dtype)).sum(1)


def check_pairs(batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of each pair: (chosen_rows, rejected_rows), each (P,), pairs in order of first
    appearance. Refuses a batch in which a pair id is not met exactly twice with exactly one
    chosen row (half a pair: the other half would be clipped apart, or missing)."""
    for key in PAIR_KEYS:
        if key not in batch:
            raise ValueError(f"a preference batch needs {key!r} (see dprc_core.preference)")
    pair = torch.as_tensor(batch["pair"]).reshape(-1).cpu()
    chosen = torch.as_tensor(batch["chosen"]).reshape(-1).cpu()
    rows = batch["labels"].shape[0]
    if pair.numel() != rows or chosen.numel() != rows:
        raise ValueError(
            f"'pair' and 'chosen' need one entry per row: {pair.numel()} and {chosen.numel()} "
            f"for {rows} rows"
        )
    if chosen.dtype != torch.bool:
        if not bool(((chosen == 0) | (chosen == 1)).all()):
            raise ValueError("'chosen' must be booleans (or 0/1)")
        chosen = chosen.bool()
    keys, inverse, counts = torch.unique(pair, return_inverse=True, return_counts=True)
    n_chosen = torch.zeros(keys.numel(), dtype=torch.long).index_add_(0, inverse, chosen.long())
    bad = (counts != 2) | (n_chosen != 1)
    if bool(bad.any()):
        which = keys[bad][:5].tolist()
        raise ValueError(
            f"pair(s) {which} do not have exactly two rows, one chosen and one rejected, in "
            "this micro-batch: a pair's two rows must be in the same micro-batch (the pair is "
            "one privacy unit, clipped once)"
        )
    order = torch.argsort(torch.tensor(_first_seen(pair.tolist(), keys.tolist())))
    chosen_rows = torch.empty(keys.numel(), dtype=torch.long)
    rejected_rows = torch.empty(keys.numel(), dtype=torch.long)
    index = torch.arange(rows)
    chosen_rows[inverse[chosen]] = index[chosen]
    rejected_rows[inverse[~chosen]] = index[~chosen]
    return chosen_rows[order], rejected_rows[order]


def _first_seen(pair: list[int], keys: list[int]) -> list[int]:
    first: dict[int, int] = {}
    for i, p in enumerate(pair):
        first.setdefault(p, i)
    return [first[k] for k in keys]


def dpo_pair_losses(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    chosen_rows: torch.Tensor,
    rejected_rows: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """(P,) the sigmoid DPO loss of each pair, from the rows' policy and reference log-probs."""
    ratios = policy_logps - ref_logps.to(policy_logps.device, policy_logps.dtype)
    delta = ratios[chosen_rows.to(ratios.device)] - ratios[rejected_rows.to(ratios.device)]
    return -F.logsigmoid(beta * delta)


def dpo_loss(beta: float) -> Callable[[nn.Module, Mapping[str, Any]], torch.Tensor]:
    """``loss_fn(model, batch) -> (B,)`` for the engine: each row half of its pair's sigmoid DPO
    loss (the batch contract is in the module docstring). Pass ``user_ids=batch["pair"]`` to
    the engine: a pair's two rows are then one unit, whose gradient ∇L_pair is clipped once."""
    beta = float(beta)
    if not beta > 0 or beta != beta or beta == float("inf"):
        raise ValueError(f"beta must be a positive finite number, got {beta}")

    def loss_fn(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        if not isinstance(batch, Mapping) or "ref_logps" not in batch:
            raise ValueError(
                "a preference batch needs 'ref_logps': the reference log-probabilities of each "
                "answer (dprc_core.preference.reference_logps), computed once before training"
            )
        if batch.get("input_ids") is not None and batch["input_ids"].dim() == 3:
            return _pair_layout_losses(model, batch, beta)
        chosen_rows, rejected_rows = check_pairs(batch)
        logps = sequence_logps(model, batch)
        ref = torch.as_tensor(batch["ref_logps"]).reshape(-1)
        if ref.numel() != logps.numel():
            raise ValueError(f"'ref_logps' has {ref.numel()} entries for {logps.numel()} rows")
        losses = dpo_pair_losses(logps, ref, chosen_rows, rejected_rows, beta)
        per_row = torch.empty_like(logps)
        per_row = per_row.index_put((chosen_rows.to(logps.device),), losses / 2)
        return per_row.index_put((rejected_rows.to(logps.device),), losses / 2)

    return loss_fn


def _pair_layout_losses(model: nn.Module, batch: Mapping[str, Any], beta: float) -> torch.Tensor:
    """(P,) losses of a batch of (P, 2, T) pairs, [:, 0] chosen, [:, 1] rejected."""
    n = batch["input_ids"].shape[0]
    rows = _pair_rows(batch)
    ref = torch.as_tensor(batch["ref_logps"])
    if tuple(ref.shape) != (n, 2):
        raise ValueError(f"'ref_logps' must be (P, 2) = ({n}, 2) for pairs, got {tuple(ref.shape)}")
    logps = sequence_logps(model, rows)
    index = torch.arange(n)
    return dpo_pair_losses(logps, ref.reshape(-1), 2 * index, 2 * index + 1, beta)


def _pair_rows(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A (P, 2, T) pair batch's tensors as (2P, T) rows: chosen, rejected, chosen, ..."""
    ids = batch["input_ids"]
    if ids.shape[1] != 2:
        raise ValueError(
            f"pairs are (P, 2, T) tensors, chosen then rejected; got input_ids {tuple(ids.shape)}"
        )
    rows = {}
    for key in ("input_ids", "attention_mask", "labels"):
        if key not in batch or batch[key] is None:
            if key == "attention_mask":
                continue
            raise ValueError(f"a preference batch needs {key!r} (see dprc_core.preference)")
        if tuple(batch[key].shape) != tuple(ids.shape):
            raise ValueError(f"{key!r} must have input_ids' shape {tuple(ids.shape)}")
        rows[key] = batch[key].reshape(-1, ids.shape[-1])
    return rows


def reference_logps(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """log π_ref(y|x) of each answer under no_grad — (B,) for rows, (P, 2) for pairs — from the
    model itself, or for a peft model with its adapters disabled (LoRA's reference is the
    frozen base). Call it before training (the reference is fixed); an engine's hooks record
    only inside its own norm pass, so nothing is recorded from it."""
    pairs = batch["input_ids"].dim() == 3
    rows = _pair_rows(batch) if pairs else batch
    disable = getattr(model, "disable_adapter", None)
    try:
        from peft import PeftModel

        is_peft = isinstance(model, PeftModel)
    except ImportError:  # pragma: no cover - peft is a dependency
        is_peft = False
    adapters_off = disable() if is_peft and disable is not None else nullcontext()
    with torch.no_grad(), adapters_off:
        logps = sequence_logps(model, rows).detach()
    return logps.reshape(-1, 2) if pairs else logps


__all__ = [
    "DEFAULT_BETA",
    "check_pairs",
    "dpo_loss",
    "dpo_pair_losses",
    "reference_logps",
    "sequence_logps",
]
