"""The small job ``dprc train`` runs in the multi-process tests (test_ddp_train.py,
test_fsdp_train.py): a tiny Llama on 48 lines, float64, its spec as YAML, and its weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.tiny import build_tiny_llama


def tiny_job(base: Path, epochs: float) -> dict:
    """The job's spec fields (no output_dir), its model and data written under ``base``."""
    model = build_tiny_llama(base / "llama", hidden=32)
    data = base / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"text": "ab" * (3 + i % 5) + "."}) + "\n" for i in range(48))
    )
    return dict(
        model=str(model),
        task="causal_lm",
        train_file=str(data),
        epochs=epochs,
        batch_size=6,
        learning_rate=1e-2,
        max_seq_len=16,
        seed=3,
        target_epsilon=4.0,
        max_physical_batch_size=2,
        dtype="float64",
        norm_method="hutch",
        k=4,
        checkpoint_every=4,
    )


def write_spec(folder: Path, job: dict, **extra) -> Path:
    """``folder/job.yaml``: the job (with ``extra`` fields), its output in ``folder/out``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump({**job, **extra, "output_dir": str(folder / "out")}))
    return path


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    last = ckpt_io.latest_checkpoint(out)
    assert last is not None
    return load_file(str(last / "model" / "model.safetensors"))


def assert_same_weights(got: dict, want: dict, tol: float = 1e-9) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        err = (got[name] - w).abs().max().item()
        assert err <= tol * max(w.abs().max().item(), 1.0), (name, err)
