"""``dprc train --nproc-per-node 2`` (torchrun, gloo) against the single-process run, and a rank
killed with SIGKILL mid-job: the job ends, a new attempt resumes from the checkpoint, and the
ledger and ε are exactly the plan's."""

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
from tests.dprc_core.distributed.processes import rank_pids
from tests.dprc_core.distributed.train_jobs import (
    assert_same_weights,
    final_weights,
    tiny_job,
    write_spec,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    return tiny_job(tmp_path_factory.mktemp("ddp-train"), epochs=3)


def dprc_train(spec: Path, nproc: int = 2) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "dprc_core.cli", "train", str(spec), "--quiet"]
    return subprocess.Popen(
        [*cmd, f"--nproc-per-node={nproc}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def single(job, tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("single") / "out"
    result = run_job(JobSpec.from_dict({**job, "output_dir": str(out)}))
    return result, final_weights(out)


def test_two_processes_train_the_single_process_job(job, single, tmp_path):
    proc = dprc_train(write_spec(tmp_path, job))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout[stdout.index("{") :])  # rank 0 alone prints it
    result, weights = single
    assert summary["status"] == "succeeded" and summary["steps"] == result.steps
    assert summary["epsilon"] == pytest.approx(result.epsilon, rel=1e-12)
    assert_same_weights(final_weights(tmp_path / "out"), weights)


def test_a_killed_rank_ends_the_job_and_a_new_attempt_resumes_exactly(job, single, tmp_path):
    spec = write_spec(tmp_path, job)
    out = tmp_path / "out"
    proc = dprc_train(spec)
    deadline = time.monotonic() + 240
    while not ckpt_io.list_checkpoints(out):  # the first checkpoint (step 4) is written
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ranks = rank_pids(proc.pid)
    assert set(ranks) == {0, 1}
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0  # the whole job ended ...
    for pid in ranks.values():  # ... and no rank is left behind
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
    done_before = len(ckpt_io.list_checkpoints(out))
    result, weights = single
    assert done_before * 4 < result.steps  # killed mid-job

    again = dprc_train(spec)
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout[stdout.index("{") :])
    assert summary["resumed_from"] > 0 and summary["status"] == "succeeded"
    last = ckpt_io.latest_checkpoint(out)
    assert last is not None
    ledger = PrivacyLedger.from_json((last / "ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == result.steps  # each step once
    assert summary["epsilon"] == pytest.approx(result.epsilon, rel=1e-12)  # the plan's ε
    assert_same_weights(final_weights(out), weights)


def _dpo_job(base: Path, job: dict) -> dict:
    """The tiny job as DPO on 24 preference pairs (issue 43): float64, hutch."""
    rows = [
        {
            "input": {"messages": [{"role": "user", "content": f"{c}?"}]},
            "preferred_output": [{"role": "assistant", "content": c * 2}],
            "non_preferred_output": [{"role": "assistant", "content": c.upper()}],
        }
        for c in "abcdefghijklmnopqrstuvwx"
    ]
    data = base / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        **job,
        "train_file": str(data),
        "method": "dpo",
        "beta": 0.5,
        "max_seq_len": 48,
        "epochs": 1,
    }


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_processes_train_the_single_process_dpo_job(job, tmp_path, sharding):
    """Each rank computes the pairs' reference log-probs (all passes together, which FSDP needs)
    and rank 0 keeps them; data-parallel, the weights equal the single process's (the same
    noise); sharded, each rank draws its own rows' noise, so the plan and ε are compared."""
    dpo = _dpo_job(tmp_path, job)
    single = run_job(
        JobSpec.from_dict(
            {**dpo, "output_dir": str(tmp_path / "single"), "token_store": str(tmp_path / "s1")}
        )
    )
    # a store of its own: the two ranks compute the reference, none is kept yet
    spec = write_spec(tmp_path / "two", dpo, sharding=sharding, token_store=str(tmp_path / "s2"))
    proc = dprc_train(spec)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout[stdout.index("{") :])
    assert summary["status"] == "succeeded" and summary["steps"] == single.steps
    assert summary["epsilon"] == pytest.approx(single.epsilon, rel=1e-12)
    if sharding == "none":
        assert_same_weights(
            final_weights(tmp_path / "two" / "out"), final_weights(tmp_path / "single")
        )
