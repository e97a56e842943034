"""``dprc train --sharding fsdp --nproc-per-node 2`` (torchrun, gloo, float64): the runner shards
the model (FSDP2) and trains the single process's job — with the noise set to zero, the same
weights to 1e-9; its checkpoints are ordinary safetensors ``from_pretrained`` loads; a rank killed
with SIGKILL ends the job and a new attempt resumes from the checkpoint (each rank's own noise
stream and optimizer shard restored) to the uninterrupted run's weights, with the ledger and ε
exactly the plan's, and its checkpoint resumes only sharded on as many ranks; what cannot run
sharded is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dprc_core.accounting import PrivacyLedger
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.runner import JobSpec
from tests.dprc_core.distributed.processes import rank_pids
from tests.dprc_core.distributed.runner_scenarios import run_without_noise
from tests.dprc_core.distributed.train_jobs import (
    assert_same_weights,
    final_weights,
    tiny_job,
    write_spec,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = Path(__file__).with_name("runner_scenarios.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    return tiny_job(tmp_path_factory.mktemp("fsdp-train"), epochs=2)


def dprc_train(spec: Path, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dprc_core.cli", "train", str(spec), "--quiet", *flags]
    return subprocess.Popen(
        cmd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_sharded_job_without_noise_trains_the_single_process_job(job, tmp_path):
    """Exact and per-example hutch, with micro-batches of 2 (so ranks pad): the sharded run's
    checkpoint equals the single process's, and from_pretrained loads it."""
    from transformers import AutoModelForCausalLM

    methods = ("exact", "hutch")
    sharded = []
    for method in methods:
        single = write_spec(tmp_path / f"single-{method}", job, norm_method=method)
        run_without_noise(str(single))
        sharded.append(
            write_spec(tmp_path / f"fsdp-{method}", job, norm_method=method, sharding="fsdp")
        )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(SCENARIOS), *map(str, sharded)]  # fmt: skip
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for method in methods:
        want = final_weights(tmp_path / f"single-{method}" / "out")
        got = final_weights(tmp_path / f"fsdp-{method}" / "out")
        assert_same_weights(got, want)
        moved = load_file(str(Path(job["model"]) / "model.safetensors"))
        assert any(not torch.equal(got[n], moved[n]) for n in moved if n in got)  # it trained
        last = ckpt_io.latest_checkpoint(tmp_path / f"fsdp-{method}" / "out")
        assert last is not None
        loaded = AutoModelForCausalLM.from_pretrained(
            last / "model", torch_dtype=torch.float64, use_safetensors=True
        )
        for name, p in loaded.state_dict().items():
            if name in got:
                assert torch.equal(p, got[name]), name
        meta = json.loads((last / "metadata.json").read_text())
        assert meta["step"] == meta["steps"]
        state = json.loads((last / "resume" / "state.json").read_text())
        assert state["ranks"] == 2 and (last / "resume" / "rank-00001" / "state.json").is_file()
        assert oct((last / "resume" / "rank-00001").stat().st_mode & 0o777) == "0o700"


def test_a_killed_rank_ends_the_sharded_job_a_new_attempt_resumes_exactly_and_only_sharded(
    job, tmp_path
):
    reference = write_spec(tmp_path / "whole", job)
    proc = dprc_train(reference, "--nproc-per-node=2", "--sharding=fsdp")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    uninterrupted = json.loads(stdout[stdout.index("{") :])
    assert uninterrupted["status"] == "succeeded"

    spec = write_spec(tmp_path / "killed", job, sharding="fsdp")
    out = tmp_path / "killed" / "out"
    proc = dprc_train(spec, "--nproc-per-node=2")
    deadline = time.monotonic() + 240
    while not ckpt_io.list_checkpoints(out):  # the first checkpoint (step 4) is written
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ranks = rank_pids(proc.pid)
    assert set(ranks) == {0, 1}
    os.kill(ranks[1], signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert len(ckpt_io.list_checkpoints(out)) * 4 < uninterrupted["steps"]  # killed mid-job

    again = dprc_train(spec, "--nproc-per-node=2")
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout[stdout.index("{") :])
    assert summary["resumed_from"] > 0 and summary["status"] == "succeeded"
    last = ckpt_io.latest_checkpoint(out)
    assert last is not None
    ledger = PrivacyLedger.from_json((last / "ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == uninterrupted["steps"]  # each step once
    assert summary["epsilon"] == pytest.approx(uninterrupted["epsilon"], rel=1e-12)
    # each rank's noise stream and optimizer shard resumed: the uninterrupted run's weights
    assert_same_weights(final_weights(out), final_weights(tmp_path / "whole" / "out"))

    # a sharded checkpoint resumes only sharded, on as many ranks (this job's folder: no other
    # sharded run is started for it)
    unsharded = write_spec(tmp_path / "killed", job)  # the same folder, unsharded
    proc = dprc_train(unsharded, "--nproc-per-node=2")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "resume with the same sharding" in stderr
    proc = dprc_train(unsharded, "--nproc-per-node=3", "--sharding=fsdp")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "resume with the same sharding" in stderr


def test_what_cannot_run_sharded_is_refused(job, tmp_path):
    with pytest.raises(ValueError, match="gaussian noise"):
        JobSpec.from_dict({**job, "output_dir": str(tmp_path), "sharding": "fsdp",
                           "noise_mechanism": "nu_dpftrl"})  # fmt: skip
    with pytest.raises(ValueError, match="sharding must be one of"):
        JobSpec.from_dict({**job, "output_dir": str(tmp_path), "sharding": "zero3"})
    one = dprc_train(write_spec(tmp_path / "one", job, sharding="fsdp"))
    _, stderr = one.communicate(timeout=120)
    assert one.returncode != 0 and "--nproc-per-node" in stderr
