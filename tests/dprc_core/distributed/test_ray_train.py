"""Multi-node jobs through Ray (issue 46) on a local cluster of two nodes (tests/ray_cluster.py,
gloo, CPU, float64): with the noise set to zero, a data-parallel job on 2 nodes and an FSDP2 job
sharded over them train the single process's weights to 1e-9; ``dprc train --nodes 2`` with its
noise runs the single process's steps with its ε; a worker node killed mid-job ends the run, the
driver killed mid-run takes its ranks with it, and the rerun resumes from the last checkpoint to
the uninterrupted run's weights, each step once in the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dprc_core.accounting import PrivacyLedger
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.runner import JobSpec, run_job
from tests.dprc_core.distributed.runner_scenarios import run_without_noise
from tests.dprc_core.distributed.train_jobs import (
    assert_same_weights,
    final_weights,
    tiny_job,
    write_spec,
)

# slow; one process runs both modules of the "ray" group, which share one local cluster
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    return tiny_job(tmp_path_factory.mktemp("ray-train"), epochs=2)


def dprc_train(spec: Path, address: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dprc_core.cli", "train", str(spec), "--quiet",
           "--nodes=2", f"--ray-address={address}", "--ray-wait=120"]  # fmt: skip
    return subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_two_nodes_without_noise_train_the_single_process_job(job, local_ray, tmp_path):
    """Data-parallel (a replica a node) and FSDP2 (half the rows a node), one launch."""
    shardings = ("none", "fsdp")
    specs = []
    for sharding in shardings:
        single = write_spec(tmp_path / f"single-{sharding}", job)
        run_without_noise(str(single))
        specs.append(write_spec(tmp_path / f"ray-{sharding}", job, sharding=sharding))
    cmd = [sys.executable, "-m", "tests.dprc_core.distributed.ray_scenarios",
           local_ray.address, "2", "1", *map(str, specs)]  # fmt: skip
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    nodes = json.loads((specs[0].parent / "placement.json").read_text())
    assert len(nodes) == 2 and nodes[0] != nodes[1]  # one rank on each node
    for sharding in shardings:
        want = final_weights(tmp_path / f"single-{sharding}" / "out")
        assert_same_weights(final_weights(tmp_path / f"ray-{sharding}" / "out"), want)


def _wait_for_checkpoints(proc: subprocess.Popen, out: Path, count: int) -> None:
    deadline = time.monotonic() + 300
    while len(ckpt_io.list_checkpoints(out)) < count:
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _train_workers() -> list[int]:
    """The pids of the Ray Train workers running a training function on this machine."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            continue
        if b"RayTrainWorker" in cmd:
            found.append(int(proc.name))
    return found


def _gone(pids: list[int]) -> bool:
    status = [Path(f"/proc/{pid}/status") for pid in pids]
    return all(not s.exists() or "zombie" in s.read_text() for s in status)


def test_a_killed_node_or_driver_ends_the_run_and_the_rerun_resumes_exactly(
    job, local_ray, tmp_path
):
    """With its noise, 16 steps, a checkpoint every 4: the worker node killed after the first
    checkpoint ends the run (exit 1, the reason); the rerun's driver (the service's launcher,
    which dies with its worker) SIGKILLed after the second takes its ranks with it, so nothing
    writes on; the last rerun resumes and ends at the single process's weights (the same
    batches and rank 0's one noise draw), steps and ε, each step once in the ledger."""
    single = run_job(JobSpec.from_dict({**job, "output_dir": str(tmp_path / "single")}))
    spec = write_spec(tmp_path / "ray", job)
    out = tmp_path / "ray" / "out"
    proc = dprc_train(spec, local_ray.address)
    _wait_for_checkpoints(proc, out, 1)
    local_ray.kill_worker_node()
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1, stderr[-4000:]
    assert "rerun the command to resume" in stderr
    assert len(ckpt_io.list_checkpoints(out)) * 4 < single.steps  # killed mid-job

    local_ray.add_worker_node()
    proc = dprc_train(spec, local_ray.address)
    done = len(ckpt_io.list_checkpoints(out))
    _wait_for_checkpoints(proc, out, done + 1)
    ranks = _train_workers()
    assert len(ranks) == 2, ranks
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while not _gone(ranks):
        assert time.monotonic() < deadline, "a rank outlived its driver"
        time.sleep(0.2)
    written = len(ckpt_io.list_checkpoints(out))
    assert written * 4 < single.steps
    time.sleep(2)
    assert len(ckpt_io.list_checkpoints(out)) == written  # nothing writes on

    again = dprc_train(spec, local_ray.address)
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr[-4000:]
    summary = json.loads(stdout[stdout.index("{") :])
    assert summary["status"] == "succeeded" and summary["resumed_from"] > 4
    assert summary["steps"] == single.steps
    last = ckpt_io.latest_checkpoint(out)
    assert last is not None
    ledger = PrivacyLedger.from_json((last / "ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == single.steps  # each step once
    assert summary["epsilon"] == pytest.approx(single.epsilon, rel=1e-12)  # the plan's ε
    assert_same_weights(final_weights(out), final_weights(tmp_path / "single"))
