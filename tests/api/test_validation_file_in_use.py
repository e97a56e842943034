"""A file that an active job scores ``valid_loss`` on cannot be deleted (409), like a training
file; once the job has ended it can."""

from __future__ import annotations

import openai
import pytest

from tests.worker.conftest import learnable_lines


def test_a_validation_file_of_an_active_job_is_in_use(server):
    client = server.client(server.key("valid-in-use"))
    train = client.files.create(file=("t.jsonl", learnable_lines(24)), purpose="fine-tune")
    valid = client.files.create(file=("v.jsonl", learnable_lines(5)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=train.id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
        extra_body={"privacy": {"target_epsilon": 8.0}, "validation_file": valid.id},
    )
    assert job.status == "queued"  # no worker in this server: the job stays active
    with pytest.raises(openai.ConflictError) as info:
        client.files.delete(valid.id)
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "file_in_use"
    client.fine_tuning.jobs.cancel(job.id)
    assert client.files.delete(valid.id).deleted
