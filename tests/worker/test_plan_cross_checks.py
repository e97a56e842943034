"""The worker checks the runner against the job's plan (issue 40): a runner that reads another
N from the training file (so samples at another q than the one charged) fails the job before
its first step is recorded; a resume that keeps its checkpoint's noise multiplier instead of
the job's says so in a job event. Through uvicorn and the official client, the attempt run
here (``execute_job``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from dprc_core.training.runner import run_job
from service.jobs import job_runs
from service.store.tables import File
from service.store.tables import Job as JobRow
from tests.api.conftest import Server, _serve, _settings
from tests.worker.conftest import learnable_lines
from worker.execution import build_spec, execute_job


@pytest.fixture(scope="module")
def no_worker(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-cross"), None))


def _job(server: Server, tenant: str):
    client = server.client(server.key(tenant))
    f = client.files.create(file=("train.jsonl", learnable_lines(24)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
        extra_body={"privacy": {"target_epsilon": 8.0}, "checkpoint_every": 1},
    )
    return client, f, job


def test_a_runner_with_another_n_fails_the_job_before_a_step_is_recorded(no_worker):
    client, f, job = _job(no_worker, "cross-n")
    with no_worker.store.sessions() as session:
        path = Path(session.scalar(select(File.storage_path).where(File.id == f.id)))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # 23 lines: the same 3 steps, q = 8/23, not 8/24
    assert execute_job(no_worker.store, job.id) == "failed"
    job = client.fine_tuning.jobs.retrieve(job.id)
    assert job.error is not None and job.error.code == "plan_mismatch"
    assert "N=23" in job.error.message and "N=24" in job.error.message
    assert job.model_extra["steps_done"] == 0


def test_a_resume_keeping_the_checkpoints_noise_multiplier_says_so(no_worker):
    client, _f, job = _job(no_worker, "cross-sigma")
    store = no_worker.store
    spec = build_spec(store, job_runs.job_request(store, job.id))
    first = run_job(spec, should_stop=lambda: True)  # an attempt that stopped after step 1
    assert first.status == "stopped" and first.steps_done == 1
    sigma = job.model_extra["privacy"]["noise_multiplier"]
    with store.sessions() as session:  # the job's σ now differs from the checkpoint's
        row = session.scalar(select(JobRow).where(JobRow.id == job.id))
        assert row is not None
        privacy = dict(row.privacy)
        mechanisms = dict(privacy["mechanisms"])
        mechanisms["noise"] = {**mechanisms["noise"], "noise_multiplier": sigma * 1.01}
        privacy["mechanisms"] = mechanisms
        row.privacy, row.noise_multiplier = privacy, sigma * 1.01
        session.commit()
    assert execute_job(store, job.id) == "succeeded"
    said = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    kept = [m for m in said if m.startswith("Warning: resuming from the checkpoint at step 1")]
    assert len(kept) == 1, said
    assert f"with its noise multiplier {sigma:.6g}" in kept[0]
    assert f"spec's noise multiplier {sigma * 1.01:.6g}" in kept[0]
