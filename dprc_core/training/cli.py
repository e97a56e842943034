"""``dprc train job.yaml``: run a job locally, as a user without the service would.

The YAML (or JSON) file holds the fields of :class:`dprc_core.training.runner.JobSpec`;
relative paths (``model``, ``train_file``, ``output_dir``) are taken relative to the file's
folder. A progress bar shows step, loss and ε spent; a run whose ``output_dir`` holds a
checkpoint resumes from it (``--no-resume`` refuses a folder that is not empty).

``--nproc-per-node N`` trains on N processes of this host (data-parallel, see
:mod:`dprc_core.distributed`): the command re-launches itself under ``torchrun``
(``torch.distributed.run --standalone``), one rank per device (``cuda:0..N-1`` over NCCL with
``device: cuda``/``auto`` on a GPU host, else N CPU processes over gloo). Started by
``torchrun`` itself (``WORLD_SIZE`` set), ``dprc train`` joins that process group — which is
how several hosts train one job (docs/training.md). With ``sharding: fsdp`` (or
``--sharding fsdp``) the processes shard the model (FSDP2,
:mod:`dprc_core.training.sharded_run`). Rank 0 prints and writes; when any rank dies torchrun
stops the others and the command exits non-zero; rerunning it resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any


def add_subparser(sub: Any) -> None:
    train = sub.add_parser("train", help="run a DP fine-tuning job from a YAML spec (library)")
    train.add_argument("spec", help="job spec (YAML or JSON)")
    train.add_argument(
        "--no-resume",
        action="store_true",
        help="never resume; refuse an output_dir that is not empty",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="train on N processes of this host (data-parallel DP-SGD under torchrun)",
    )
    train.add_argument(
        "--sharding",
        choices=("none", "fsdp"),
        default=None,
        help="fsdp: shard the model over the N processes (FSDP2: each holds 1/N of the "
        "parameters, gradients and optimizer state); default: the spec's sharding (none)",
    )
    train.set_defaults(func=_train)


def load_spec(path: str | Path, sharding: str | None = None):
    import yaml

    from dprc_core.training.runner import JobSpec

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read job spec {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"job spec {path} must be a mapping of fields")
    for key in ("model", "train_file", "validation_file", "output_dir"):
        if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
            data[key] = str((path.parent / data[key]).resolve())
    # a deprecated field's warning is shown (Python hides DeprecationWarning outside __main__)
    if sharding is not None:  # --sharding overrides the spec's
        data["sharding"] = sharding
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        spec = JobSpec.from_dict(data)
    for w in caught:
        if issubclass(w.category, DeprecationWarning):
            print(f"dprc train: warning: {path}: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return spec


def _launch(args: argparse.Namespace) -> int:
    """Run this command again on ``args.nproc_per_node`` ranks under torchrun."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc_per_node}",
        "--max-restarts=0",
        "-m",
        "dprc_core.cli",
        "train",
        str(Path(args.spec).resolve()),
    ]
    if args.no_resume:
        cmd.append("--no-resume")
    if args.quiet:
        cmd.append("--quiet")
    if args.sharding is not None:
        cmd.append(f"--sharding={args.sharding}")
    return subprocess.call(cmd)


def _train(args: argparse.Namespace) -> int:
    import os

    if args.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        load_spec(args.spec, args.sharding)  # a bad spec fails here, once, not on every rank
        return _launch(args)
    import torch

    from dprc_core.distributed import join_torchrun_group

    spec = load_spec(args.spec, args.sharding)
    if spec.sharding == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise ValueError(
            "sharding: fsdp shards the model over several processes: run with "
            "--nproc-per-node N (N >= 2), or under torchrun"
        )
    # checked before joining the process group: every rank checks before any rank writes
    out = Path(spec.output_dir)
    if args.no_resume and out.is_dir() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; --no-resume needs an empty or new output_dir")
    joined = join_torchrun_group(spec.device)
    try:
        return _train_here(args, spec)
    finally:
        if joined:
            torch.distributed.destroy_process_group()


def _train_here(args: argparse.Namespace, spec: Any) -> int:
    from tqdm import tqdm

    from dprc_core.distributed import current_ranks
    from dprc_core.training.learnability import LearnabilityWarning
    from dprc_core.training.runner import run_job

    main = current_ranks().is_main
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if args.quiet:
            return
        if bar is None:
            bar = tqdm(total=p.steps, initial=p.step - 1, unit="step", dynamic_ncols=True)
        post = {"eps": f"{p.epsilon:.3f}" if p.epsilon is not None else "-"}
        if p.loss is not None:
            post["loss"] = f"{p.loss:.4f}"
        bar.set_postfix(post)
        bar.update(1)

    def event(message: str) -> None:  # the data's progress; a warning even when quiet
        if main and (not args.quiet or message.startswith("Warning: ")):
            print(message, file=sys.stderr, flush=True)

    with warnings.catch_warnings():  # printed once, as the run's event
        warnings.simplefilter("ignore", LearnabilityWarning)
        result = run_job(spec, on_progress=progress, resume=not args.no_resume, on_event=event)
    if bar is not None:
        bar.close()
    if not main:
        return 0
    print(
        json.dumps(
            {
                "status": result.status,
                "steps_done": result.steps_done,
                "steps": result.steps,
                "epsilon": result.epsilon,
                "delta": result.delta,
                "privacy_unit": result.plan.unit,  # ε and δ are per example, or per user
                "units": result.plan.dataset_size,
                "noise_multiplier": result.plan.noise_multiplier,
                "clipping": result.plan.clipping,
                "checkpoint": result.checkpoint,
                "resumed_from": result.resumed_from,
                "seconds": round(result.seconds, 1),
            },
            indent=2,
        )
    )
    return 0
