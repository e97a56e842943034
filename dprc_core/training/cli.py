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

``--nodes M --ray-address HOST:6379`` trains on M hosts of a Ray cluster, ``--nproc-per-node``
ranks on each (:mod:`dprc_core.training.ray_launch`): this process drives Ray Train's
``TorchTrainer`` and prints the result; the spec's files must be at the same path on every node.
Nothing about the privacy changes with the shape: the plan, the batches and ε are those of one
process.
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
        "--nodes",
        type=int,
        default=1,
        metavar="M",
        help="train on M hosts of the Ray cluster at --ray-address, --nproc-per-node ranks on "
        "each (pip install 'dprc[ray]')",
    )
    train.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="the Ray cluster's address (default: $RAY_ADDRESS); runs the job through Ray even "
        "with --nodes 1",
    )
    train.add_argument(
        "--ray-wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the cluster's nodes before giving up (default 300)",
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


def _check_fresh(args: argparse.Namespace, spec: Any) -> None:
    out = Path(spec.output_dir)
    if args.no_resume and out.is_dir() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; --no-resume needs an empty or new output_dir")


def _ray_address(args: argparse.Namespace) -> str | None:
    import os

    return args.ray_address or (os.environ.get("RAY_ADDRESS") if args.nodes > 1 else None)


def _launch_ray(args: argparse.Namespace, address: str) -> int:
    """Drive the job's ranks on the Ray cluster at ``address``; print rank 0's result."""
    import tempfile

    from dprc_core.training.ray_launch import RayRunFailed, Shape, run_on_ray

    spec = load_spec(args.spec, args.sharding)  # a bad spec fails here, once
    shape = Shape(args.nodes, args.nproc_per_node)
    if spec.sharding == "fsdp" and shape.world_size < 2:
        raise ValueError(
            "sharding: fsdp shards the model over several processes: nodes × "
            f"devices must be >= 2, got {shape}"
        )
    _check_fresh(args, spec)
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ray-", dir=out) as tmp:
        result = Path(tmp) / "result.json"
        config = {
            "spec": str(Path(args.spec).resolve()),
            "sharding": args.sharding,
            "no_resume": args.no_resume,
            "result": str(result),
        }
        try:
            run_on_ray(
                ray_rank,
                config,
                shape,
                address=address,
                storage=Path(tmp),
                use_gpu=_wants_gpu(spec),
                wait_seconds=args.ray_wait,
                name="dprc-train",
            )
        except RayRunFailed as exc:
            print(f"dprc train: {exc}", file=sys.stderr)
            print(
                "dprc train: rerun the command to resume from the last checkpoint", file=sys.stderr
            )
            return 1
        print(result.read_text())
    return 0


def _wants_gpu(spec: Any) -> bool | None:
    """Whether the ranks take a GPU each: ``device`` cuda; auto: when the cluster has GPUs."""
    if spec.device == "cpu":
        return False
    return True if str(spec.device).startswith("cuda") else None


def ray_rank(config: dict) -> None:
    """One rank of ``dprc train`` under Ray (:func:`_launch_ray`): rank 0 writes the result."""
    from dprc_core.training.ray_launch import join_ray_rank

    join_ray_rank()
    args = argparse.Namespace(
        spec=config["spec"],
        sharding=config["sharding"],
        no_resume=config["no_resume"],
        quiet=True,
    )
    spec = load_spec(args.spec, args.sharding)
    summary = _run(args, spec)
    if summary is not None:
        Path(config["result"]).write_text(json.dumps(summary, indent=2))


def _train(args: argparse.Namespace) -> int:
    import os

    if args.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {args.nodes}")
    address = _ray_address(args)
    if args.nodes > 1 and address is None:
        raise ValueError(
            f"--nodes {args.nodes}: several hosts train through Ray; give the cluster's "
            "address (--ray-address HOST:6379 or $RAY_ADDRESS)"
        )
    if address is not None and "WORLD_SIZE" not in os.environ:
        return _launch_ray(args, address)
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
    _check_fresh(args, spec)
    joined = join_torchrun_group(spec.device)
    try:
        return _train_here(args, spec)
    finally:
        if joined:
            torch.distributed.destroy_process_group()


def _train_here(args: argparse.Namespace, spec: Any) -> int:
    summary = _run(args, spec)
    if summary is not None:
        print(json.dumps(summary, indent=2))
    return 0


def _run(args: argparse.Namespace, spec: Any) -> dict[str, Any] | None:
    """Run the job on this rank; rank 0 gets the result's summary (other ranks None)."""
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
        return None
    return {
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
    }
