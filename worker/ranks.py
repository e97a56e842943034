"""A job on several devices: its ranks under ``torchrun`` on this host, or on several hosts
through Ray, watched by the worker.

The worker process keeps the job's lease and heartbeat and talks to the store; the ranks only
train (``worker.rank_main``: :func:`dprc_core.training.runner.run_job` in each rank, rank 0
writing the checkpoints). They talk through files in the job's private run folder
(``<run>/ranks/``, 0700):

* ``spec.json`` — the job spec (it holds the seed: private, like the rest of the folder);
* ``progress.jsonl`` — rank 0 appends one :class:`~dprc_core.training.runner.Progress` per step;
  the worker turns each line into the same progress, checkpoint and event records a
  single-device job makes;
* ``events.jsonl`` — rank 0 appends the runner's event lines (``on_event``: e.g. a resume that
  keeps its checkpoint's noise multiplier); the worker records each as a job event;
* ``stop`` — the worker creates it when the job must stop (cancel, pause, shutdown, lost
  lease); rank 0 reads it between steps and every rank stops after the same checkpoint;
* ``result.json`` (rank 0, on a clean end) or ``error.json`` (a rank's Python error: the job
  fails with its code and message);
* ``ranks.log`` — torchrun's and the ranks' output.

**The data's stores** of a big training file (:data:`STORE_CHILD_BYTES` or more) are built
before the job's ranks (or its one in-process run) start, by a child process
(``python -m worker.rank_main stores CONTROL``, :func:`build_stores`) through the same files
(``spec.json``, ``events.jsonl`` for the tokenizing progress, ``stop``, ``error.json``), so
the memory a build takes (the tokenizer's batches, the sorted digests) goes back to the
system when it exits: a job on an embedded server grows the API process by its model and its
steps, not by the build. The run then opens the finished store (its checksums verified).

**Several hosts** (``nodes`` > 1, ``DPRC_LAUNCHER=ray``): the launcher is ``python -m
worker.rank_main ray CONTROL`` (its shape and the cluster's address in ``CONTROL/ray.json``), a
Ray driver that runs ``nodes × devices`` ranks through Ray Train's ``TorchTrainer``
(:mod:`dprc_core.training.ray_launch`); each rank runs the same rank program, so the files
above are the protocol on every shape. ``CONTROL`` is in the job's run folder, which every node
reaches at the same path (shared storage, docs/deploy.md): rank 0 writes there wherever Ray
placed it. A node that dies ends the Ray run (Ray restarts nothing) and the launcher exits
non-zero: :class:`RanksDied`, as below. Rank 0 reports where the ranks ran as a job event. The
cluster lacking the job's nodes for ``DPRC_RAY_WAIT_SECONDS`` fails the job
(``nodes_unavailable``). When the launcher exits, killed or not, Ray ends the ranks it owns.

A rank that dies without ``error.json`` (a signal, the OOM killer) makes torchrun stop the others
(``--max-restarts=0``); :class:`RanksDied` tells the worker, which ends this attempt and lets a
new one resume from the last checkpoint. Every process of the tree is bound to its parent's
life (``PR_SET_PDEATHSIG``: the launcher dies with the worker, each rank with the launcher), and
the worker stops the launcher on any way out (SIGTERM: torchrun stops its ranks; then SIGKILL),
so no rank outlives the attempt.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dprc_core.training.ray_launch import Shape
from dprc_core.training.runner import JobSpec, Progress

POLL_SECONDS = 0.2
FILES = ("progress.jsonl", "events.jsonl", "stop", "result.json", "error.json")
PR_SET_PDEATHSIG = 1
# a training file this large (bytes) or larger has its stores built in a child process
STORE_CHILD_BYTES = 8 << 20


@dataclass
class RanksResult:
    """What the worker needs of a multi-rank run that ended cleanly."""

    status: str  # "succeeded" | "stopped"
    steps: int
    units: int | None = None  # the plan's N (examples, or users)
    sample_rate: float | None = None  # the plan's q


@dataclass(frozen=True)
class RayCluster:
    """Where a job on several hosts runs: the Ray cluster's address, and how long an attempt
    waits for the job's nodes."""

    address: str
    wait_seconds: float = 600.0


class RanksDied(RuntimeError):
    """A rank ended without a Python error (killed): the attempt is over, the job resumable."""


class RankFailure(RuntimeError):
    """A rank raised: the job fails with ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no orphaned ranks)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def control_dir(spec: JobSpec) -> Path:
    return Path(spec.output_dir) / "ranks"


def builds_in_child(spec: JobSpec) -> bool:
    """Whether the job's stores are built by a child process (a big training file)."""
    return Path(spec.train_file).stat().st_size >= STORE_CHILD_BYTES


def build_stores(
    spec: JobSpec,
    should_stop: Callable[[], bool],
    on_event: Callable[[str], None] | None = None,
) -> bool:
    """Build (or verify) the job's stores in a child process; ``on_event`` gets its progress.
    Returns False when the job was asked to stop before the build ended (the child is
    stopped; a build it left unfinished is never opened: token_store's atomic rename).
    Raises :class:`RankFailure` (a data error, with the in-process code) or
    :class:`RanksDied`."""
    control = control_dir(spec)
    control.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in FILES:
        (control / name).unlink(missing_ok=True)
    (control / "spec.json").write_text(json.dumps(spec.to_dict()))
    cmd = [sys.executable, "-m", "worker.rank_main", "stores", str(control)]
    with open(control / "ranks.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        events = 0

        def event(line: dict) -> None:
            if on_event is not None:
                on_event(str(line["message"]))

        while True:
            ended = proc.poll() is not None
            events = _forward_lines(control / "events.jsonl", events, event)
            if ended:
                break
            if should_stop():
                return False
            time.sleep(POLL_SECONDS)
        error = control / "error.json"
        if error.exists():
            data = json.loads(error.read_text())
            raise RankFailure(data["code"], data["message"])
        if proc.returncode != 0:
            tail = (control / "ranks.log").read_bytes()[-2000:].decode(errors="replace")
            raise RanksDied(f"the data's build ended without finishing: {tail}")
        return True
    finally:
        _kill_tree(proc)


def run_on_ranks(
    spec: JobSpec,
    shape: Shape,
    on_progress: Callable[[Progress], None],
    should_stop: Callable[[], bool],
    on_event: Callable[[str], None] | None = None,
    ray: RayCluster | None = None,
) -> RanksResult:
    """Run ``spec`` on ``shape.world_size`` ranks (on this host under torchrun; through the
    Ray cluster ``ray`` when the shape has several nodes); returns when they end. Raises
    :class:`RankFailure` or :class:`RanksDied`. ``on_event``: rank 0's runner events
    (``events.jsonl``)."""
    control = control_dir(spec)
    control.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in FILES:
        (control / name).unlink(missing_ok=True)
    (control / "spec.json").write_text(json.dumps(spec.to_dict()))
    if shape.nodes > 1:
        if ray is None:
            raise ValueError(f"a job on {shape} runs through Ray: no cluster was given")
        (control / "ray.json").write_text(
            json.dumps(
                {
                    "nodes": shape.nodes,
                    "devices": shape.devices,
                    "address": ray.address,
                    "wait_seconds": ray.wait_seconds,
                }
            )
        )
        cmd = [sys.executable, "-m", "worker.rank_main", "ray", str(control)]
    else:
        cmd = [sys.executable, "-m", "worker.rank_main", "launch", str(shape.devices), str(control)]
    with open(control / "ranks.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signalled as one on the way out
        )
    try:
        return _watch(proc, control, on_progress, should_stop, on_event)
    finally:
        _kill_tree(proc)


def _watch(
    proc: subprocess.Popen,
    control: Path,
    on_progress: Callable[[Progress], None],
    should_stop: Callable[[], bool],
    on_event: Callable[[str], None] | None = None,
) -> RanksResult:
    offset = events = 0
    stop = control / "stop"

    def event(line: dict) -> None:
        if on_event is not None:
            on_event(str(line["message"]))

    while True:
        ended = proc.poll() is not None
        events = _forward_lines(control / "events.jsonl", events, event)
        offset = _forward_progress(control / "progress.jsonl", offset, on_progress)
        if ended:
            break
        if not stop.exists() and should_stop():
            stop.touch()
        time.sleep(POLL_SECONDS)
    result, error = control / "result.json", control / "error.json"
    if result.exists() and proc.returncode == 0:
        data = json.loads(result.read_text())
        return RanksResult(
            status=data["status"],
            steps=int(data["steps"]),
            units=data.get("units"),
            sample_rate=data.get("sample_rate"),
        )
    if error.exists():
        data = json.loads(error.read_text())
        raise RankFailure(data["code"], data["message"])
    tail = (control / "ranks.log").read_bytes()[-2000:].decode(errors="replace")
    raise RanksDied(f"a rank ended without finishing (launcher exit {proc.returncode}): {tail}")


def _forward_progress(path: Path, offset: int, on_progress: Callable[[Progress], None]) -> int:
    """Hand every complete new line of ``path`` to ``on_progress``; the new offset."""
    return _forward_lines(path, offset, lambda line: on_progress(Progress(**line)))


def _forward_lines(path: Path, offset: int, handle: Callable[[Any], None]) -> int:
    """Hand every complete new JSON line of ``path`` to ``handle``; the new offset."""
    if not path.exists():
        return offset
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1  # a line rank 0 is still writing waits for the next poll
    for line in chunk[:end].splitlines():
        if line.strip():
            handle(json.loads(line))
    return offset + end


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the ranks' process group, SIGKILL what is left after a grace period."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
    proc.wait()
