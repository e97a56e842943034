"""Sharded parameters (FSDP2, ``torch.distributed.fsdp.fully_shard``) for the engine.

Under FSDP2 every parameter is a ``DTensor`` sharded on dimension 0 over a 1-D device mesh:
rank r holds rows [r·c, min((r+1)·c, n)) of a parameter of n rows (c = ⌈n/W⌉, torch.chunk's
split; a rank may hold none). The forward and the backward all-gather the parameters, so each
rank's hooks see whole layers and compute the per-sample norms and clipped contributions of its
own examples exactly as without sharding.

After each micro-batch (every rank runs the same number: :meth:`PrivacyEngine.pad`), the engine
forms its clipped sum parameter by parameter (book-keeping: Σ c_i·A_iᵀG_i from the stored layer
factors) and SUM-reduces it across the ranks a bucket at a time, each rank adding its own rows
to its shard of the batch's clipped sum (:func:`reduce_into_shards`): no rank ever holds a
whole gradient, only a bucket of it. At ``step()``, on every rank together:

1. each rank holds its rows of the logical batch's clipped sum (the sum over all ranks);
2. each rank adds the Gaussian noise to **its rows only**, from a stream of its own (keyed by the
   secret seed, the rank — its shard — and the step; secure mode: ChaCha20 keyed HMAC(root,
   "noise/rank"), stream = parameter, per step), so every coordinate is noised exactly once, by
   the rank that holds it, with the single-process law N(0, σ²C²);
3. the noised shard, divided by q·N, becomes the sharded parameter's ``.grad`` (a DTensor with
   the parameter's placement), and the optimizer steps on the shards (its state is sharded).

Two-pass clipping is refused under sharding: its second backward goes through FSDP's own
reduce-scatter, once per micro-batch — a collective every rank must join as often as the others,
which Poisson sampling (a different number of micro-batches per rank, or none) cannot promise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dprc_core.distributed import BUCKET_BYTES, Ranks, all_reduce_sum

# how a job's ranks hold the model (a job spec's, and a service job's, ``sharding``): "none",
# each rank the whole model (data-parallel); "fsdp", FSDP2: each rank 1/W of the parameters,
# gradients and optimizer state (dprc_core/training/sharded_run.py)
SHARDINGS = ("none", "fsdp")


def is_dtensor(p: torch.Tensor) -> bool:
    return type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor"


@dataclass(frozen=True)
class ShardLayout:
    """Where a sharded parameter's local rows sit in the whole parameter."""

    shape: torch.Size  # the whole parameter's
    start: int  # its first local row
    rows: int  # its local rows (0: this rank holds none)

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a whole-parameter tensor."""
        return full.narrow(0, self.start, self.rows)


def shard_layout(p: torch.Tensor, ranks: Ranks) -> ShardLayout:
    """The local rows of an FSDP2 parameter (Shard(0) on a 1-D mesh of the engine's ranks), or
    ValueError naming what does not fit."""
    from torch.distributed.tensor import Shard

    mesh, placements = p.device_mesh, p.placements  # type: ignore[attr-defined]
    if mesh.ndim != 1 or len(placements) != 1 or placements[0] != Shard(0):
        raise ValueError(
            f"a sharded parameter placed as {placements} on a {mesh.ndim}-D mesh: only "
            "FSDP2's Shard(0) on a 1-D mesh (fully_shard without HSDP) is supported"
        )
    if mesh.size() != ranks.world_size:
        raise ValueError(
            f"the parameters are sharded over {mesh.size()} ranks, the engine's process group "
            f"has {ranks.world_size}: shard over the engine's group"
        )
    n = p.shape[0]
    chunk = -(-n // ranks.world_size)
    start = min(ranks.rank * chunk, n)
    rows = max(0, min(chunk, n - start))
    local = p.to_local()  # type: ignore[attr-defined]
    if local.shape[0] != rows or tuple(local.shape[1:]) != tuple(p.shape[1:]):
        raise ValueError(
            f"a sharded parameter of shape {tuple(p.shape)} holds {tuple(local.shape)} on rank "
            f"{ranks.rank}, not the {rows} rows of torch.chunk's split that FSDP2 uses"
        )
    return ShardLayout(p.shape, start, rows)


def check_sharded_model(model: nn.Module, params: Sequence[torch.Tensor]) -> bool:
    """Whether the trainable parameters are FSDP2 shards (all of them, or none)."""
    sharded = [is_dtensor(p) for p in params]
    if not any(sharded):
        return False
    if not all(sharded):
        names = [n for n, p in model.named_parameters() if p.requires_grad and not is_dtensor(p)]
        raise ValueError(
            f"some trainable parameters are sharded (FSDP2) and others are not ({names[:3]}): "
            "fully_shard the root module too, so every trainable parameter is sharded"
        )
    return True


def full_zeros(p: torch.Tensor) -> torch.Tensor:
    """A plain (unsharded) zero tensor of the whole parameter's shape, on its local device."""
    local = p.to_local() if is_dtensor(p) else p  # type: ignore[attr-defined]
    return torch.zeros(p.shape, dtype=p.dtype, device=local.device)


def reduce_into_shards(
    whole: Callable[[int], torch.Tensor],
    layouts: list[ShardLayout],
    ranks: Ranks,
    into: dict[int, torch.Tensor],
) -> None:
    """SUM-reduce each parameter's whole tensor ``whole(i)`` across the ranks and add this
    rank's rows to ``into[i]``, a bucket at a time: at most BUCKET_BYTES of whole tensors (or
    one parameter) are alive at once, so a rank never holds a whole gradient. Every rank calls
    it with every parameter, in the same order (the buckets are the same on every rank)."""
    bucket: list[tuple[int, torch.Tensor]] = []
    size = 0

    def flush() -> None:
        all_reduce_sum([full for _, full in bucket], ranks)
        for i, full in bucket:
            rows = layouts[i].local(full)
            into[i] = rows.clone() if i not in into else into[i] + rows
        bucket.clear()

    for i in range(len(layouts)):
        full = whole(i)
        nbytes = full.numel() * full.element_size()
        if bucket and size + nbytes > BUCKET_BYTES:
            flush()
            size = 0
        bucket.append((i, full))
        size += nbytes
    if bucket:
        flush()


def as_shard_grad(local: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The local rows as a gradient of the sharded parameter ``p`` (its mesh and placement)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        p.device_mesh,  # type: ignore[attr-defined]
        p.placements,  # type: ignore[attr-defined]
        run_check=False,
        shape=p.shape,
        stride=p.stride(),
    )


def local_tensor(p: torch.Tensor) -> torch.Tensor:
    """A parameter's local part (itself when it is not sharded)."""
    return p.to_local() if is_dtensor(p) else p  # type: ignore[attr-defined]
