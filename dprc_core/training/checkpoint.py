"""Checkpoints: safetensors + JSON, never pickles; written atomically.

Layout of ``<run>/checkpoints/step-000040/``::

    model/            RELEASED  weights (.safetensors; LoRA: the adapter alone), config, tokenizer
    ledger.json       RELEASED  the privacy ledger of every step in this checkpoint's chain
    metadata.json     RELEASED  step, steps planned, epsilon spent at delta, job summary
    resume/           PRIVATE   optimizer.safetensors, rng.safetensors (sampler, projection and
                                noise generator states), state.json

``resume/`` must never leave the server: the noise generator's state reveals the noise that
was added, which would void the guarantee. :func:`release_files` lists what may be shared.

A checkpoint is written into a temporary folder and renamed into place, so a crash leaves
either the whole checkpoint or none of it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from safetensors.torch import load_file, save_file

CHECKPOINT_DIRNAME = "checkpoints"
RELEASED = ("model", "ledger.json", "metadata.json")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIRNAME / f"step-{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINT_DIRNAME
    if not root.is_dir():
        return []
    done = [
        p
        for p in root.iterdir()
        if p.name.startswith("step-")
        and not p.name.endswith(".tmp")
        and (p / "metadata.json").exists()
    ]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def release_files(ckpt: str | Path) -> list[Path]:
    """Every file of a checkpoint that may be released (``resume/`` excluded)."""
    ckpt = Path(ckpt)
    out: list[Path] = []
    for name in RELEASED:
        p = ckpt / name
        if p.is_dir():
            out.extend(sorted(x for x in p.rglob("*") if x.is_file()))
        elif p.is_file():
            out.append(p)
    return out


# ------------------------------------------------------------- optimizer state <-> safetensors
def _flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for idx, values in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}


# ---------------------------------------------------------------------------- save / load
class _SavesPretrained(Protocol):
    """A Hugging Face (``PreTrainedModel``) or peft (``PeftModel``) model."""

    def save_pretrained(self, save_directory: Any, **kwargs: Any) -> Any: ...


def save_checkpoint(
    run_dir: str | Path,
    *,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    ledger_json: str,
    metadata: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    rng: dict[str, torch.Tensor],
    state: dict[str, Any],
) -> Path:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "resume").mkdir(parents=True)
    (tmp / "resume").chmod(0o700)  # private before anything is written into it, whatever umask
    # a Hugging Face or peft model (load_model's); save_pretrained is not an nn.Module method
    cast(_SavesPretrained, model).save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    (tmp / "ledger.json").write_text(ledger_json)
    tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
    save_file(tensors, str(tmp / "resume" / "optimizer.safetensors"))
    save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "resume" / "rng.safetensors"))
    (tmp / "resume" / "state.json").write_text(
        json.dumps({**state, "optimizer": opt_meta}, sort_keys=True)
    )
    for private in (tmp / "resume").iterdir():
        private.chmod(0o600)
    (tmp / "metadata.json").write_text(json.dumps(metadata, sort_keys=True, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def load_resume(ckpt: str | Path) -> tuple[dict[str, Any], dict, dict[str, torch.Tensor], str]:
    """(state, optimizer state dict, rng tensors, ledger JSON) of a checkpoint."""
    ckpt = Path(ckpt)
    state = json.loads((ckpt / "resume" / "state.json").read_text())
    opt = _unflatten_optimizer(
        load_file(str(ckpt / "resume" / "optimizer.safetensors")), state.pop("optimizer")
    )
    rng = load_file(str(ckpt / "resume" / "rng.safetensors"))
    return state, opt, rng, (ckpt / "ledger.json").read_text()
