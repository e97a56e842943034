"""The reference log-probabilities of a DPO job's pairs, and its preference metrics.

DPO (:mod:`dprc_core.preference`) compares the policy's log-probabilities of each pair's two
outputs with the reference policy's, the job's starting model (for LoRA: the same model with
its adapters disabled). They are computed once, before step 1, in eval mode under
``torch.no_grad``, in micro-batches of whole pairs, and kept:

* for a tokenized store (:mod:`dprc_core.training.token_store`), in its folder:
  ``reference/<fingerprint>.f64`` ((N, 2) float64, preferred then non-preferred) with a
  ``.json`` beside it holding its SHA-256; ``<fingerprint>`` hashes the starting model's folder
  (its path and each file's name, size and modification time), the dtype and the device type.
  A resumed job, or a later job from the same model on the same data, reads them back instead
  of computing them again (a file that fails its hash is computed again, never used). They
  are a function of the private data and live with it: never in a checkpoint, never returned
  by the service.
* for data tokenized in memory, nowhere: they are computed for the run.

With several ranks, rank 0 decides whether the kept values are used (every rank then reads
them: the store is on a file system every rank reaches, as checkpoints are) or computed (every
rank computes them, all passes together, which a sharded model needs; rank 0 writes them).

A resumed full fine-tune whose reference was not kept (a store removed since) loads the
starting model again to compute it: the weights being trained are no longer the reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dprc_core.distributed import Ranks, broadcast_flag
from dprc_core.preference import dpo_pair_losses, reference_logps, sequence_logps
from dprc_core.training.data import Batches

REFERENCE_DIR = "reference"


@dataclass
class WithReference:
    """Preference pairs with their reference log-probabilities: ``batch(index)`` is the pairs'
    (P, 2, T) batch plus ``ref_logps`` (P, 2), as :func:`dprc_core.preference.dpo_loss`
    takes it."""

    data: Batches
    ref_logps: torch.Tensor  # (N, 2) float64
    pad_id: int = 0

    def __post_init__(self) -> None:
        self.pad_id = self.data.pad_id

    def __len__(self) -> int:
        return len(self.data)

    def batch(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        out = self.data.batch(index)
        idx = torch.as_tensor([int(i) for i in index], dtype=torch.long)
        out["ref_logps"] = self.ref_logps[idx]
        return out


def model_fingerprint(model_dir: str | Path, dtype: str, device: torch.device) -> str:
    """What the reference depends on besides the data: the starting model's folder (path, and
    each file's name, size and modification time), the dtype and the device type."""
    folder = Path(model_dir).resolve()
    h = hashlib.sha256()
    h.update(f"{folder}\0{dtype}\0{device.type}\0".encode())
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def kept_reference(
    data: Batches,
    compute: Callable[[], torch.Tensor],
    fingerprint: str,
    ranks: Ranks,
) -> torch.Tensor:
    """(N, 2) reference log-probs of ``data``'s pairs: read back from the store's folder when
    kept there for ``fingerprint`` (and intact), else ``compute()``-d (and kept, by rank 0).
    In-memory data: computed."""
    folder = getattr(data, "path", None)
    if folder is None:
        return compute()
    path = Path(folder) / REFERENCE_DIR / f"{fingerprint}.f64"
    kept = _read(path, len(data)) if ranks.is_main else None
    if broadcast_flag(kept is not None, ranks):
        return kept if kept is not None else _read_or_fail(path, len(data))
    values = compute()
    if ranks.is_main:
        _write(path, values)
    return values


def _read(path: Path, n: int) -> torch.Tensor | None:
    sidecar = path.with_suffix(".json")
    if not path.exists() or not sidecar.exists():
        return None
    try:
        meta = json.loads(sidecar.read_text())
        raw = path.read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("sha256") != hashlib.sha256(raw).hexdigest() or len(raw) != n * 2 * 8:
        return None  # altered or from another build: computed again, never used
    return torch.from_numpy(np.frombuffer(raw, dtype=np.float64).copy().reshape(n, 2))


def _read_or_fail(path: Path, n: int) -> torch.Tensor:
    values = _read(path, n)
    if values is None:
        raise RuntimeError(
            f"rank 0 found the reference log-probabilities in {path}, this rank cannot read "
            "them: the token store must be on a file system every rank reaches"
        )
    return values


def _write(path: Path, values: torch.Tensor) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = values.to(torch.float64).contiguous().numpy().tobytes()
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_bytes(raw)
    os.replace(tmp, path)
    meta = {"sha256": hashlib.sha256(raw).hexdigest(), "shape": list(values.shape)}
    tmp_meta = path.with_name(f".{path.stem}.json.{uuid.uuid4().hex}")
    tmp_meta.write_text(json.dumps(meta))
    os.replace(tmp_meta, path.with_suffix(".json"))


@torch.no_grad()
def compute_reference(model: torch.nn.Module, data: Batches, batch_size: int) -> torch.Tensor:
    """(N, 2) float64: log π_ref of each pair's outputs under ``model`` (a peft model with its
    adapters disabled: :func:`dprc_core.preference.reference_logps`), in eval mode, in
    micro-batches of ``batch_size`` pairs; the model's mode is restored."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = torch.empty(len(data), 2, dtype=torch.float64)
    try:
        for start in range(0, len(data), batch_size):
            idx = list(range(start, min(start + batch_size, len(data))))
            batch = {k: v.to(device) for k, v in data.batch(idx).items()}
            out[start : start + len(idx)] = reference_logps(model, batch).double().cpu()
    finally:
        model.train(was_training)
    return out


@torch.no_grad()
def preference_metrics(
    model: torch.nn.Module, data: WithReference, beta: float, batch_size: int
) -> dict[str, float]:
    """TRL's DPO evaluation metrics over every pair of ``data`` (eval mode, no gradient):
    ``valid_loss`` (mean sigmoid DPO loss), ``valid_reward_margin`` (mean of β·[(log π(y⁺) −
    log π_ref(y⁺)) − (log π(y⁻) − log π_ref(y⁻))]) and ``valid_reward_accuracy`` (the fraction
    of pairs whose margin is > 0). Not private with respect to ``data``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss = margin = correct = 0.0
    try:
        for start in range(0, len(data), batch_size):
            idx = list(range(start, min(start + batch_size, len(data))))
            batch = {k: v.to(device) for k, v in data.batch(idx).items()}
            n = len(idx)
            ids = batch["input_ids"]
            rows = {
                k: batch[k].reshape(2 * n, ids.shape[-1])
                for k in ("input_ids", "attention_mask", "labels")
            }
            logps = sequence_logps(model, rows).double()
            ref = batch["ref_logps"].reshape(-1).double()
            even = torch.arange(n, device=logps.device) * 2
            losses = dpo_pair_losses(logps, ref, even, even + 1, beta)
            rewards = beta * (logps - ref.to(logps.device))
            margins = rewards[even] - rewards[even + 1]
            loss += float(losses.sum())
            margin += float(margins.sum())
            correct += float((margins > 0).sum())
    finally:
        model.train(was_training)
    n_pairs = max(len(data), 1)
    return {
        "valid_loss": loss / n_pairs,
        "valid_reward_margin": margin / n_pairs,
        "valid_reward_accuracy": correct / n_pairs,
    }


def start_model_reference(
    load: Callable[[], torch.nn.Module], data: Batches, batch_size: int
) -> torch.Tensor:
    """The reference computed from a freshly loaded starting model (a resumed full fine-tune
    whose kept reference is gone), freed afterwards."""
    model = load()
    try:
        return compute_reference(model, data, batch_size)
    finally:
        del model
