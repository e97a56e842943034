"""Data-parallel DP-SGD on ``torch.distributed`` (docs/design.md §3, "Several devices").

The model is **not** wrapped in ``DistributedDataParallel``: its reducer would all-reduce (and
average) every backward's gradients, the norm pass's included, so clipped sums would be
double-counted and divided by the world size. The engine reduces instead, once per logical
batch, and refuses wrapped models (:func:`refuse_wrapped_model`); FSDP2-sharded models
are handled by :mod:`dprc_core.sharding`.

One logical batch is one Poisson draw over the whole data set from a seed all ranks share;
rank ``r`` of ``W`` takes the examples whose index is ``r`` modulo ``W``
(:func:`shard_indices`), so the ranks' parts are disjoint and their union is exactly the batch
that was accounted. Every rank takes every step, an empty part included: it still joins the
reduction. Gaussian noise is drawn once, by rank 0, and added to its part before the SUM
reduction, so the global sum carries exactly one N(0, σ²C²) draw per coordinate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

BUCKET_BYTES = 25 * 2**20  # the size of one all-reduce, as DDP's default bucket


@dataclass(frozen=True)
class Ranks:
    """This process's place in the process group (rank 0 of 1 without torch.distributed)."""

    rank: int = 0
    world_size: int = 1
    group: Any = None
    device: torch.device = torch.device("cpu")  # where the group's collectives run

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current_ranks(group: Any = None) -> Ranks:
    """The ranks of ``group`` (the default group) when a process group is initialised."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return Ranks()
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    return Ranks(dist.get_rank(group), dist.get_world_size(group), group, device)


def join_torchrun_group(device: str = "auto") -> bool:
    """Under torchrun (``WORLD_SIZE`` > 1) initialise the default process group — NCCL with
    one CUDA device per local rank when ``device`` allows CUDA and it is there, else gloo.
    True if this call initialised it (the caller then destroys it)."""
    import os

    dist = torch.distributed
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available")
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    return True


def shard_indices(indices: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The part of a logical batch's example indices that ``ranks.rank`` computes."""
    if not ranks.distributed:
        return indices
    return indices[owned(indices, ranks)]


def owned(indices: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Which of ``indices`` (bool mask) :func:`shard_indices` gives to ``ranks.rank``."""
    return indices % ranks.world_size == ranks.rank


def refuse_wrapped_model(model: nn.Module) -> None:
    """Refuse models whose framework reduces gradients behind the engine's back (DDP,
    DataParallel, FSDP1). FSDP2's sharded parameters are handled by the engine
    (:mod:`dprc_core.sharding`)."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    for name, module in [("", model), *model.named_modules()]:
        where = f" (module {name!r})" if name else ""
        if isinstance(module, DistributedDataParallel):
            raise ValueError(
                f"the model is wrapped in DistributedDataParallel{where}: its gradient "
                "all-reduce would add (and average) every backward across ranks, so the clipped "
                "sums would be counted twice. Pass the unwrapped model inside the initialised "
                "process group: the PrivacyEngine reduces the clipped sums itself"
            )
        if isinstance(module, DataParallel):
            raise ValueError(
                f"the model is wrapped in DataParallel{where}: it splits batches behind the "
                "engine's back; use one process per device (torchrun) instead"
            )
        if "FullyShardedDataParallel" in type(module).__name__:
            raise ValueError(
                f"the model is wrapped in FSDP1's FullyShardedDataParallel{where}: its "
                "flattened parameters hide the layers from the per-sample hooks. Shard it with "
                "FSDP2 instead (torch.distributed.fsdp.fully_shard on its blocks and root), "
                'which the PrivacyEngine supports (docs/engine.md, "Sharded models")'
            )


def broadcast_int(value: int | None, ranks: Ranks) -> int:
    """Rank 0's ``value`` on every rank (a secret seed stays inside the group)."""
    if not ranks.distributed:
        assert value is not None
        return int(value)
    t = torch.tensor(
        [int(value) if ranks.is_main and value is not None else 0],
        dtype=torch.int64,
        device=ranks.device,
    )
    torch.distributed.broadcast(t, src=_global_rank(ranks, 0), group=ranks.group)
    return int(t.item())


def broadcast_bytes(value: bytes | None, ranks: Ranks, size: int) -> bytes:
    """Rank 0's ``size`` bytes on every rank (e.g. a secret key, which stays in the group)."""
    if not ranks.distributed:
        assert value is not None and len(value) == size
        return value
    if ranks.is_main:
        assert value is not None and len(value) == size
        t = torch.tensor(list(value), dtype=torch.uint8, device=ranks.device)
    else:
        t = torch.zeros(size, dtype=torch.uint8, device=ranks.device)
    torch.distributed.broadcast(t, src=_global_rank(ranks, 0), group=ranks.group)
    return bytes(t.cpu().tolist())


def all_reduce_max_int(value: int, ranks: Ranks) -> int:
    """The largest ``value`` over the ranks (e.g. micro-batches a step: sharded models pad
    to it)."""
    if not ranks.distributed:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=ranks.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=ranks.group)
    return int(t.item())


def broadcast_object(value: Any, ranks: Ranks, src: int) -> Any:
    """Rank ``src``'s picklable ``value`` on every rank (inside the group only)."""
    if not ranks.distributed:
        return value
    box = [value if ranks.rank == src else None]
    torch.distributed.broadcast_object_list(box, src=_global_rank(ranks, src), group=ranks.group)
    return box[0]


def broadcast_flag(flag: bool, ranks: Ranks) -> bool:
    """Rank 0's ``flag`` on every rank (e.g. "stop after this step")."""
    if not ranks.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], device=ranks.device)
    torch.distributed.broadcast(t, src=_global_rank(ranks, 0), group=ranks.group)
    return bool(t.item())


def check_same_on_all_ranks(what: str, fingerprint: str, ranks: Ranks) -> None:
    """Raise on every rank unless ``fingerprint`` is the same on all of them."""
    if not ranks.distributed:
        return
    digests: list[Any] = [None] * ranks.world_size
    torch.distributed.all_gather_object(digests, fingerprint, group=ranks.group)
    if len(set(digests)) != 1:
        raise ValueError(
            f"the ranks disagree on {what}: every rank must build the same engine for the same "
            f"model (rank {ranks.rank} has {fingerprint!r}, the ranks have {digests})"
        )


def all_gather_ints(values: Sequence[int], ranks: Ranks) -> list[list[int]]:
    """Every rank's ``values`` (int64), in rank order, on every rank: one all-gather of their
    lengths, then one of the values padded to the longest (none when every rank has none)."""
    if not ranks.distributed:
        return [[int(v) for v in values]]
    dist, device = torch.distributed, ranks.device
    mine = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(ranks.world_size)]
    count = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    dist.all_gather(sizes, count, group=ranks.group)
    lengths = [int(n.item()) for n in sizes]
    longest = max(lengths)
    if longest == 0:
        return [[] for _ in lengths]
    padded = torch.zeros(longest, dtype=torch.int64, device=device)
    padded[: mine.numel()] = mine
    parts = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(parts, padded, group=ranks.group)
    return [part[:n].tolist() for part, n in zip(parts, lengths, strict=True)]


def parameter_fingerprint(params: Sequence[torch.Tensor]) -> str:
    """Shapes and dtypes of the trainable parameters, in order (not their values)."""
    text = ";".join(f"{tuple(p.shape)}:{p.dtype}" for p in params)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def all_reduce_sum(tensors: Sequence[torch.Tensor], ranks: Ranks) -> None:
    """SUM-reduce ``tensors`` in place across ranks, in buckets of at most BUCKET_BYTES
    (one flat buffer per bucket; tensors grouped by device and dtype)."""
    if not ranks.distributed:
        return
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for bucket in (b for ts in groups.values() for b in _buckets(ts)):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        on = flat if flat.device == ranks.device else flat.to(ranks.device)
        torch.distributed.all_reduce(on, op=torch.distributed.ReduceOp.SUM, group=ranks.group)
        flat = on.to(flat.device)
        offset = 0
        for t in bucket:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def _buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append(t)
        size += nbytes
    return [b for b in out if b]


def _global_rank(ranks: Ranks, group_rank: int) -> int:
    if ranks.group is None:
        return group_rank
    return int(torch.distributed.get_global_rank(ranks.group, group_rank))
