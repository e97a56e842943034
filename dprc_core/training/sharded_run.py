"""What a job run does differently when its ranks shard the model (``sharding: fsdp``).

* **The model** is loaded whole on every rank (from the local folder, or the checkpoint's
  ``model/`` on resume), then each of its blocks — the classes the Hugging Face model names in
  ``_no_split_modules`` (a decoder layer), else the layers of its largest ``ModuleList`` — and
  then the root are ``fully_shard``-ed over the job's ranks (FSDP2 on a 1-D mesh of
  ``device``'s type: gloo on CPUs, NCCL on GPUs). From then on each rank holds 1/W of the
  parameters, of the gradients and of the optimizer's state; the engine does the rest
  (:mod:`dprc_core.sharding`).
* **Lockstep.** Every rank runs as many micro-batches as the rank with the most in the step
  (``all_reduce_max_int``, agreed before any pass); the others pad (``PrivacyEngine.pad``)
  with the first rows of the data set, whose passes contribute nothing.
* **Checkpoints** stay ordinary: every rank joins the gathering of the whole model
  (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``) and rank 0 writes it with
  ``save_pretrained`` — the safetensors ``from_pretrained`` loads. Each rank's private state
  (its rows' noise stream, its shard of the optimizer's state) goes into the checkpoint's
  ``resume/`` (:func:`dprc_core.training.checkpoint.write_rank_state`); a resume needs the
  same number of ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dprc_core import sharding
from dprc_core.distributed import Ranks


def check_ranks(ranks: Ranks) -> None:
    if not ranks.distributed:
        raise ValueError(
            "sharding: fsdp needs several ranks (dprc train --nproc-per-node N with N >= 2, or "
            "a service job with devices >= 2); on one device train with sharding: none"
        )


def block_modules(model: nn.Module) -> list[nn.Module]:
    """The model's blocks to shard one by one: the modules of the classes its Hugging Face
    model names in ``_no_split_modules``, else the children of its largest ``ModuleList``."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(
            f"{type(model).__name__} names no blocks (no _no_split_modules and no ModuleList "
            "of layers): sharding: fsdp shards a model block by block"
        )
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(largest)


def shard_model(model: nn.Module, ranks: Ranks, device: torch.device) -> nn.Module:
    """``fully_shard`` every block, then the root, over the job's ranks (in place)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    check_ranks(ranks)
    mesh = init_device_mesh(device.type, (ranks.world_size,))
    for block in block_modules(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def reshard(model: nn.Module) -> None:
    """Free the whole parameters a forward without backward left gathered: FSDP2 keeps the
    root's after its forward (they are resharded after the backward), and the engine refuses
    a model whose trainable parameters are not all sharded. A no-op for an unsharded model."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def whole_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (empty on the others); every rank joins."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}


def local_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's state dict with each sharded tensor replaced by this rank's rows."""
    return {
        "state": {
            idx: {k: sharding.local_tensor(v) if torch.is_tensor(v) else v for k, v in s.items()}
            for idx, s in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def load_local_optimizer_state(opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The inverse of :func:`local_optimizer_state`: this rank's rows, as shards of the
    parameters they belong to, loaded into ``opt``."""
    params = [p for group in opt.param_groups for p in group["params"]]
    out: dict[str, Any] = {"state": {}, "param_groups": state["param_groups"]}
    for idx, per_param in state["state"].items():
        p = params[int(idx)]
        local = sharding.local_tensor(p)
        out["state"][idx] = {
            k: (
                sharding.as_shard_grad(v.to(local.device), p)
                if sharding.is_dtensor(p)
                and torch.is_tensor(v)
                and v.dim() > 0
                and tuple(v.shape) == tuple(local.shape)
                else v
            )
            for k, v in per_param.items()
        }
    opt.load_state_dict(out)


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        torch.distributed.barrier(group=ranks.group)
