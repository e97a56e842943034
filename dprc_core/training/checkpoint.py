"""Checkpoints: safetensors + JSON, never pickles; written atomically.

Layout of ``<run>/checkpoints/step-000040/``::

    model/                    RELEASED  weights (.safetensors; LoRA: the adapter alone), config,
                                        tokenizer
    ledger.json               RELEASED  the privacy ledger of every step in this checkpoint's chain
    metadata.json             RELEASED  step, steps planned, epsilon spent at delta, job summary
    resume/                   PRIVATE   what a run needs to continue (:class:`ResumeState`):
      state.json                        steps done, the plan, secure_rng, the optimizer's
                                        settings, and the engine's and the sampler's state dicts
                                        whole (nested as they return them), each tensor in them
                                        replaced by a reference ``{"$tensor": "engine/noise/key"}``
      state.safetensors                 the tensors of those two state dicts, by reference
      optimizer.safetensors             the optimizer's per-parameter tensors
      rank-00001/ …                     a sharded (FSDP2) run's rank r ≥ 1: its own engine and
                                        optimizer state (its rows' noise stream, its shard of
                                        the optimizer state) in the same three files; rank 0's
                                        are the folder's own (``state.json`` says ``ranks``)

``resume/`` must never leave the server: the engine's state reveals the noise that was added
(its generators' states; in secure mode the noise, projection and sampling keys), which would
void the guarantee. :func:`release_files` lists what may be shared.

A checkpoint is written into a temporary folder and renamed into place, so a crash leaves
either the whole checkpoint or none of it; a sharded run's ranks write their private state into
that folder (:func:`begin_checkpoint`, :func:`write_rank_state`) before rank 0 finishes and
renames it (:func:`finish_checkpoint`). :func:`read_resume` also reads the resume state of
checkpoints whose ``resume/`` holds ``rng.safetensors`` (the engine's generators, noise and
projections and the sampler flattened into ``engine:``/``noise:``/``projections:``/``sampler:``
keys) and a ``state.json`` without ``format``.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from safetensors.torch import load_file, save_file

CHECKPOINT_DIRNAME = "checkpoints"
RELEASED = ("model", "ledger.json", "metadata.json")
RESUME_FORMAT = 2  # state.json's "format": state dicts whole (absent: the flattened layout)
_TENSOR = "$tensor"  # a tensor's reference in state.json: {"$tensor": its key in state.safetensors}


@dataclass(frozen=True)
class ResumeState:
    """What a run needs to continue from a checkpoint. PRIVATE, but for ``ledger_json`` (the
    checkpoint's released ledger)."""

    steps_done: int
    plan: dict[str, Any]  # PrivacyPlan.to_dict() of the plan the run follows
    secure_rng: bool
    engine: dict[str, Any]  # PrivacyEngine.state_dict(), whole
    sampler: dict[str, Any]  # the sampler's state_dict(), whole
    optimizer: dict[str, Any]  # the torch optimizer's state_dict()
    ledger_json: str
    # a sharded (FSDP2) run: its number of ranks; engine and optimizer are then rank 0's, each
    # other rank's are in resume/rank-<r>/ (read_rank_state)
    ranks: int | None = None


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


def read_metadata(ckpt: str | Path) -> dict[str, Any]:
    """A checkpoint's released ``metadata.json`` (step, epsilon, the job's summary)."""
    return cast(dict[str, Any], json.loads((Path(ckpt) / "metadata.json").read_text()))


def written_secure_rng(ckpt: str | Path) -> bool | None:
    """The randomness mode a checkpoint's resume state was written in; None without one."""
    state_file = Path(ckpt) / "resume" / "state.json"
    if not state_file.is_file():
        return None
    return bool(json.loads(state_file.read_text()).get("secure_rng", False))


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


# ------------------------------------------------------- nested state dicts <-> JSON + tensors
def _split_tensors(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` as JSON, each tensor moved into ``tensors`` under its path and referenced."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous()
        return {_TENSOR: path}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"a state dict's keys must be strings (at {path!r})")
        return {k: _split_tensors(v, f"{path}/{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split_tensors(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    return value


def _join_tensors(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of :func:`_split_tensors`."""
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return tensors[value[_TENSOR]]
        return {k: _join_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_join_tensors(v, tensors) for v in value]
    return value


# ---------------------------------------------------------------------------- save / load
class _SavesPretrained(Protocol):
    """A Hugging Face (``PreTrainedModel``) or peft (``PeftModel``) model."""

    def save_pretrained(self, save_directory: Any, **kwargs: Any) -> Any: ...


def write_checkpoint(
    run_dir: str | Path,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    metadata: dict[str, Any],
    resume: ResumeState,
) -> Path:
    """Write the checkpoint of step ``resume.steps_done`` atomically; returns its folder."""
    begin_checkpoint(run_dir, resume.steps_done)
    return finish_checkpoint(
        run_dir, model=model, tokenizer=tokenizer, metadata=metadata, resume=resume
    )


def temporary_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is renamed into place."""
    final = checkpoint_dir(run_dir, step)
    return final.with_name(final.name + ".tmp")


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """A fresh temporary folder for the checkpoint of ``step`` (one process: rank 0), its
    ``resume/`` private before anything is written into it, whatever the umask."""
    tmp = temporary_dir(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "resume").mkdir(parents=True)
    (tmp / "resume").chmod(0o700)
    return tmp


def rank_dir(folder: Path, rank: int) -> Path:
    """A sharded run's rank's private state in a checkpoint (``folder``: its ``resume/``)."""
    return folder / f"rank-{rank:05d}"


def write_rank_state(
    run_dir: str | Path,
    step: int,
    rank: int,
    engine: dict[str, Any],
    optimizer: dict[str, Any],
) -> None:
    """A sharded run's rank ``rank`` ≥ 1 writes its engine and optimizer state into the
    checkpoint of ``step`` that rank 0 began (:func:`begin_checkpoint`) and will finish."""
    if rank < 1:
        raise ValueError("rank 0's state is the checkpoint's own (finish_checkpoint)")
    folder = rank_dir(temporary_dir(run_dir, step) / "resume", rank)
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    _write_private_state(folder, {}, engine, optimizer)


def finish_checkpoint(
    run_dir: str | Path,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    metadata: dict[str, Any],
    resume: ResumeState,
    model_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the released files and rank 0's resume state into the begun checkpoint of step
    ``resume.steps_done`` and rename it into place; returns its folder. ``model_state``: the
    model's whole state dict when the model itself is sharded (gathered by every rank)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    final = checkpoint_dir(run_dir, resume.steps_done)
    tmp = temporary_dir(run_dir, resume.steps_done)
    if resume.ranks is not None:
        missing = [r for r in range(1, resume.ranks) if not rank_dir(tmp / "resume", r).is_dir()]
        if missing:
            raise RuntimeError(f"the checkpoint of step {resume.steps_done} lacks ranks {missing}")
    # a Hugging Face or peft model (load_model's); save_pretrained is not an nn.Module method
    saved = cast(_SavesPretrained, model)
    if model_state is None:
        saved.save_pretrained(tmp / "model", safe_serialization=True)
    else:
        saved.save_pretrained(tmp / "model", state_dict=model_state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    (tmp / "ledger.json").write_text(resume.ledger_json)
    _write_resume(tmp / "resume", resume)
    (tmp / "metadata.json").write_text(json.dumps(metadata, sort_keys=True, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _write_resume(folder: Path, resume: ResumeState) -> None:
    """``resume/``: its files 0600 (the folder is 0700 already)."""
    shared = {
        "steps_done": resume.steps_done,
        "plan": resume.plan,
        "secure_rng": resume.secure_rng,
        "sampler": resume.sampler,
    }
    if resume.ranks is not None:
        shared["ranks"] = resume.ranks
    _write_private_state(folder, shared, resume.engine, resume.optimizer)


def _write_private_state(
    folder: Path, shared: dict[str, Any], engine: dict[str, Any], optimizer: dict[str, Any]
) -> None:
    """state.json (+ state.safetensors) and optimizer.safetensors in ``folder``, 0600."""
    opt_tensors, opt_meta = _flatten_optimizer(optimizer)
    save_file(opt_tensors, str(folder / "optimizer.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, Any] = {"format": RESUME_FORMAT}
    for key, value in shared.items():
        state[key] = value if key != "sampler" else _split_tensors(value, "sampler", tensors)
        if key == "secure_rng":  # the state dicts' own key order, as before
            state["engine"] = _split_tensors(engine, "engine", tensors)
    if "engine" not in state:
        state["engine"] = _split_tensors(engine, "engine", tensors)
    state["optimizer"] = opt_meta
    save_file(tensors, str(folder / "state.safetensors"))
    (folder / "state.json").write_text(json.dumps(state))
    for private in folder.iterdir():
        if private.is_file():
            private.chmod(0o600)


def read_rank_state(ckpt: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A sharded checkpoint's rank ``rank`` ≥ 1: (its engine state, its optimizer state)."""
    folder = rank_dir(Path(ckpt) / "resume", rank)
    if not (folder / "state.json").is_file():
        raise ValueError(f"the checkpoint {ckpt} holds no private state of rank {rank}")
    state = json.loads((folder / "state.json").read_text())
    optimizer = _unflatten_optimizer(
        load_file(str(folder / "optimizer.safetensors")), state["optimizer"]
    )
    tensors = load_file(str(folder / "state.safetensors"))
    return _join_tensors(state["engine"], tensors), optimizer


def read_resume(ckpt: str | Path) -> ResumeState:
    """The resume state of a checkpoint (either layout, see the module's docstring)."""
    ckpt = Path(ckpt)
    state = json.loads((ckpt / "resume" / "state.json").read_text())
    optimizer = _unflatten_optimizer(
        load_file(str(ckpt / "resume" / "optimizer.safetensors")), state["optimizer"]
    )
    ledger_json = (ckpt / "ledger.json").read_text()
    if "format" not in state:
        rng = load_file(str(ckpt / "resume" / "rng.safetensors"))
        return _resume_from_flat(state, optimizer, rng, ledger_json)
    if state["format"] != RESUME_FORMAT:
        raise ValueError(f"unsupported resume state format {state['format']!r} in {ckpt}")
    tensors = load_file(str(ckpt / "resume" / "state.safetensors"))
    return ResumeState(
        steps_done=int(state["steps_done"]),
        plan=state["plan"],
        secure_rng=bool(state["secure_rng"]),
        engine=_join_tensors(state["engine"], tensors),
        sampler=_join_tensors(state["sampler"], tensors),
        optimizer=optimizer,
        ledger_json=ledger_json,
        ranks=int(state["ranks"]) if state.get("ranks") is not None else None,
    )


def _resume_from_flat(
    state: dict[str, Any], optimizer: dict, rng: dict[str, torch.Tensor], ledger_json: str
) -> ResumeState:
    """The resume state of the flattened layout: ``rng.safetensors`` keys split by prefix."""

    def prefixed(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix) :]: v for k, v in rng.items() if k.startswith(prefix)}

    engine = {
        "steps": state["engine"]["steps"],
        "seed": state["engine"]["seed"],
        "generators": prefixed("engine:"),
        "noise": prefixed("noise:"),
        "projections": prefixed("projections:"),
    }
    sampler: dict[str, Any]
    if state.get("sampler") is not None:  # fixed order: its JSON state
        sampler = state["sampler"]
    elif "sampler" in rng:  # Poisson: its generator's state
        sampler = {"generator": rng["sampler"]}
    else:  # secure Poisson: its key and position
        sampler = prefixed("sampler:")
    return ResumeState(
        steps_done=int(state["steps_done"]),
        plan=state["plan"],
        secure_rng=bool(state.get("secure_rng", False)),
        engine=engine,
        sampler=sampler,
        optimizer=optimizer,
        ledger_json=ledger_json,
    )


# ------------------------------------------------------------------- the deprecated spellings
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
    """Deprecated: :func:`write_checkpoint` with a :class:`ResumeState`. ``rng`` and ``state``
    are the flattened form (``engine:``/``noise:``/``projections:``/``sampler:`` keys)."""
    warnings.warn(
        "save_checkpoint(rng=..., state=...) is deprecated; call "
        "write_checkpoint(resume=ResumeState(...))",
        DeprecationWarning,
        stacklevel=2,
    )
    if int(state["steps_done"]) != step:
        raise ValueError(f"step={step} but state['steps_done']={state['steps_done']}")
    resume = _resume_from_flat(state, optimizer.state_dict(), rng, ledger_json)
    return write_checkpoint(
        run_dir, model=model, tokenizer=tokenizer, metadata=metadata, resume=resume
    )


def load_resume(ckpt: str | Path) -> tuple[dict[str, Any], dict, dict[str, torch.Tensor], str]:
    """Deprecated: :func:`read_resume`. (state, optimizer state dict, rng tensors, ledger JSON)
    in the flattened form."""
    warnings.warn(
        "load_resume() is deprecated; call read_resume()", DeprecationWarning, stacklevel=2
    )
    resume = read_resume(ckpt)
    engine, sampler = resume.engine, resume.sampler
    rng = {f"engine:{k}": v for k, v in engine["generators"].items()}
    rng.update({f"noise:{k}": v for k, v in engine["noise"].items()})
    rng.update({f"projections:{k}": v for k, v in engine["projections"].items()})
    tensors: dict[str, torch.Tensor] = {}
    _split_tensors(sampler, "sampler", tensors)
    if not tensors:  # fixed order: all JSON
        json_sampler: dict[str, Any] | None = sampler
    else:
        json_sampler = None
        if set(sampler) == {"generator"}:
            rng["sampler"] = sampler["generator"]
        else:
            rng.update({f"sampler:{k}": v for k, v in sampler.items()})
    state = {
        "steps_done": resume.steps_done,
        "plan": resume.plan,
        "engine": {"steps": engine["steps"], "seed": engine["seed"]},
        "secure_rng": resume.secure_rng,
        "sampler": json_sampler,
    }
    return state, resume.optimizer, rng, resume.ledger_json
