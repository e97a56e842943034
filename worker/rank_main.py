"""The processes of a multi-device job (see :mod:`worker.ranks`).

``python -m worker.rank_main launch N CONTROL`` — the launcher: bound to the worker's life, it
runs torchrun (``--standalone --nproc-per-node N --max-restarts=0``) with the rank program.
``python -m worker.rank_main rank CONTROL`` — one rank: joins the process group and runs the
job spec in ``CONTROL/spec.json``; rank 0 reports progress and the end through ``CONTROL``.
``python -m worker.rank_main ray CONTROL`` — the launcher of a job on several hosts: a Ray
driver (``CONTROL/ray.json``: nodes, devices, the cluster's address) whose ranks run
:func:`ray_rank` (:mod:`dprc_core.training.ray_launch`).
``python -m worker.rank_main stores CONTROL`` — builds (or verifies) the tokenized stores of
the job spec in ``CONTROL/spec.json`` and exits, its memory returned (``worker.ranks``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from worker.ranks import die_with_parent


def launch(devices: int, control: Path) -> int:
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the worker died before the binding took effect
        return 1
    from torch.distributed.run import main as torchrun

    torchrun(
        [
            "--standalone",
            f"--nproc-per-node={devices}",
            "--max-restarts=0",
            "-m",
            "worker.rank_main",
            "rank",
            str(control),
        ]
    )
    return 0


def ray_launch(control: Path) -> int:
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:
        return 1
    from dprc_core.training.ray_launch import NodesUnavailable, RayRunFailed, Shape, run_on_ray
    from dprc_core.training.runner import JobSpec

    conf = json.loads((control / "ray.json").read_text())
    spec = JobSpec.from_dict(json.loads((control / "spec.json").read_text()))
    cuda = spec.device.startswith("cuda")
    try:
        run_on_ray(
            ray_rank,
            {"control": str(control.resolve())},
            Shape(int(conf["nodes"]), int(conf["devices"])),
            address=str(conf["address"]),
            storage=(control / "ray").resolve(),
            use_gpu=False if spec.device == "cpu" else (True if cuda else None),
            wait_seconds=float(conf["wait_seconds"]),
            name="dprc-job",
        )
    except NodesUnavailable as exc:
        (control / "error.json").write_text(json.dumps({"code": exc.code, "message": str(exc)}))
        return 1
    except RayRunFailed as exc:  # a rank's error.json, if any, says why; else a lost node
        print(exc, file=sys.stderr, flush=True)
        return 1
    return 0


def ray_rank(config: dict) -> None:
    """One rank of a job on several hosts, in a Ray Train worker (the group is Ray's)."""
    from dprc_core.training.ray_launch import join_ray_rank, placement, placement_line

    join_ray_rank()
    control = Path(config["control"])
    nodes = placement()
    if _is_main():
        _event(control, f"Ranks placed by Ray: {placement_line(nodes)}")
    _run_rank(control)


def _is_main() -> bool:
    from dprc_core.distributed import current_ranks

    return current_ranks().is_main


def _event(control: Path, message: str) -> None:
    with (control / "events.jsonl").open("a") as f:
        f.write(json.dumps({"message": message}) + "\n")
        f.flush()


def rank(control: Path) -> int:
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:
        return 1
    import torch

    from dprc_core.distributed import join_torchrun_group
    from dprc_core.training.runner import JobSpec

    spec = JobSpec.from_dict(json.loads((control / "spec.json").read_text()))
    joined = join_torchrun_group(spec.device)
    try:
        return _run_rank(control)
    finally:
        if joined:
            torch.distributed.destroy_process_group()


def _run_rank(control: Path) -> int:
    """Run the job of ``control/spec.json`` on this rank of the group; rank 0 reports."""
    from dprc_core.distributed import current_ranks
    from dprc_core.training.runner import JobSpec, Progress, run_job
    from worker.attempt import failure_of

    spec = JobSpec.from_dict(json.loads((control / "spec.json").read_text()))
    main = current_ranks().is_main
    progress = control / "progress.jsonl"
    stop = control / "stop"

    def on_progress(p: Progress) -> None:
        with progress.open("a") as f:
            f.write(json.dumps(p.__dict__) + "\n")
            f.flush()

    def on_event(message: str) -> None:
        # the runner's warnings (a resume keeping its checkpoint's σ, a plan unlikely to learn)
        # become job events, as a one-device job's; the data's progress was told when the
        # worker prepared the stores (prepare_data_stores)
        if message.startswith("Warning: "):
            _event(control, message)

    try:
        result = run_job(
            spec,
            on_progress=on_progress if main else None,
            should_stop=stop.exists,
            on_event=on_event if main else None,
        )
        if main:
            (control / "result.json").write_text(
                json.dumps(
                    {
                        "status": result.status,
                        "steps": result.steps,
                        "units": result.plan.dataset_size,
                        "sample_rate": result.plan.sample_rate,
                    }
                )
            )
        return 0
    except Exception as exc:
        if not _lost_a_peer(exc):  # a peer's death is the attempt's end, not the job's error
            code, message = failure_of(exc)
            (control / "error.json").write_text(json.dumps({"code": code, "message": message}))
        raise


def stores(control: Path) -> int:
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:
        return 1
    from dprc_core.training.runner import JobSpec, prepare_data_stores
    from worker.attempt import failure_of

    spec = JobSpec.from_dict(json.loads((control / "spec.json").read_text()))

    def on_event(message: str) -> None:
        with (control / "events.jsonl").open("a") as f:
            f.write(json.dumps({"message": message}) + "\n")
            f.flush()

    try:
        prepare_data_stores(spec, on_event)
        return 0
    except Exception as exc:
        code, message = failure_of(exc)
        (control / "error.json").write_text(json.dumps({"code": code, "message": message}))
        return 1


PEER_LOST = ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "NCCL")


def _lost_a_peer(exc: BaseException) -> bool:
    """A collective failed because another rank went away (gloo raises a plain RuntimeError
    naming its transport; torch's own DistError otherwise)."""
    import torch

    return isinstance(exc, torch.distributed.DistError) or any(m in str(exc) for m in PEER_LOST)


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"] and len(argv) == 3:
        return launch(int(argv[1]), Path(argv[2]))
    if argv[:1] == ["rank"] and len(argv) == 2:
        code = rank(Path(argv[1]))  # a Python error propagates: its traceback, exit status 1
        # leave without the interpreter's teardown: FSDP2 over gloo can abort it on a busy
        # machine ("terminate called without an active exception") after the rank's work is
        # done and its group destroyed, which torchrun would report as a rank that died
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if argv[:1] == ["ray"] and len(argv) == 2:
        return ray_launch(Path(argv[1]))
    if argv[:1] == ["stores"] and len(argv) == 2:
        return stores(Path(argv[1]))
    print(
        "usage: python -m worker.rank_main launch N CONTROL | rank CONTROL | ray CONTROL | "
        "stores CONTROL",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
