"""``dprc train job.yaml``: run a job locally, as a user without the service would.

The YAML (or JSON) file holds the fields of :class:`dprc_core.training.runner.JobSpec`;
relative paths (``model``, ``train_file``, ``output_dir``) are taken relative to the file's
folder. A progress bar shows step, loss and ε spent; a run whose ``output_dir`` holds a
checkpoint resumes from it (``--no-resume`` refuses to, if the folder is not empty).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_subparser(sub: Any) -> None:
    train = sub.add_parser("train", help="run a DP fine-tuning job from a YAML spec (library)")
    train.add_argument("spec", help="job spec (YAML or JSON)")
    train.add_argument(
        "--no-resume",
        action="store_true",
        help="never resume; refuse an output_dir that already has checkpoints",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_train)


def load_spec(path: str | Path):
    import yaml

    from dprc_core.training.runner import JobSpec

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read job spec {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"job spec {path} must be a mapping of fields")
    for key in ("model", "train_file", "output_dir"):
        if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
            data[key] = str((path.parent / data[key]).resolve())
    return JobSpec.from_dict(data)


def _train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dprc_core.training import checkpoint as ckpt_io
    from dprc_core.training.runner import run_job

    spec = load_spec(args.spec)
    if args.no_resume and ckpt_io.list_checkpoints(spec.output_dir):
        raise ValueError(f"{spec.output_dir} already holds checkpoints (--no-resume)")
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

    result = run_job(spec, on_progress=progress, resume=not args.no_resume)
    if bar is not None:
        bar.close()
    print(
        json.dumps(
            {
                "status": result.status,
                "steps_done": result.steps_done,
                "steps": result.steps,
                "epsilon": result.epsilon,
                "delta": result.delta,
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
