"""A worker killed between writing a checkpoint and recording it: the next attempt records it.

The first attempt is reproduced exactly as far as it got: the runner wrote every checkpoint of
the job into its run folder (the last one included) and nothing reached the store. The next
attempt (``execute_job``) resumes from that last checkpoint, runs no step, and must still end
the job with that checkpoint recorded and downloadable, and ε the plan's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dprc_core.accounting import epsilon
from dprc_core.training.runner import run_job
from service.jobs import job_runs
from tests.api.conftest import Server, _serve, _settings
from tests.worker.conftest import learnable_lines
from worker.execution import build_spec, execute_job


@pytest.fixture(scope="module")
def no_worker(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-missed"), None))


def test_the_last_checkpoint_written_but_not_recorded_is_recorded(no_worker):
    client = no_worker.client(no_worker.key("missed"))
    f = client.files.create(file=("train.jsonl", learnable_lines(24)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
        extra_body={"privacy": {"target_epsilon": 8.0}, "checkpoint_every": 2},
    )
    store = no_worker.store
    spec = build_spec(store, job_runs.job_request(store, job.id))
    first = run_job(spec)  # the killed attempt: checkpoints on disk, none in the store
    assert first.status == "succeeded"
    assert not client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert execute_job(store, job.id) == "succeeded"
    job = client.fine_tuning.jobs.retrieve(job.id)
    assert job.status == "succeeded"
    priv = job.model_extra["privacy"]
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in ckpts] == [priv["steps"]]
    assert client.files.content(ckpts[0].model_extra["file_id"]).read()[:1]  # downloadable
    want = epsilon(
        priv["noise_multiplier"], priv["sample_rate"], priv["steps"], priv["target_delta"]
    )
    assert abs(priv["epsilon_spent"] - want) <= 1e-9 * want
    assert job.model_extra["steps_done"] == priv["steps"]
