"""A validation file through the official openai client (embedded worker): checkpoint metrics
carry valid_loss and epsilon, the results CSV is a tenant file listed in result_files whose
rows equal the step events, report_train_loss: false leaves the training-data columns empty,
and validation files that would break a promise are refused."""

from __future__ import annotations

import openai
import pytest

from dprc_core.training.results import read_results
from tests.worker.conftest import learnable_lines, wait_for


def _job(client, train_id, valid_id, **privacy):
    return client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=train_id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32},
        extra_body={
            "validation_file": valid_id,
            "privacy": {"target_epsilon": 6.0, "clipping": {"method": "exact"}, **privacy},
            "checkpoint_every": 2,
        },
    )


def test_validation_metrics_and_results_file_without_train_loss(embedded):
    client = embedded.client(embedded.key("valid"))
    train = client.files.create(file=("t.jsonl", learnable_lines(24)), purpose="fine-tune")
    valid = client.files.create(file=("v.jsonl", learnable_lines(5)), purpose="fine-tune")
    job = _job(client, train.id, valid.id, report_train_loss=False)
    assert job.validation_file == valid.id
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.error
    ckpts = sorted(
        client.fine_tuning.jobs.checkpoints.list(job.id).data, key=lambda c: c.step_number
    )
    assert [c.step_number for c in ckpts] == [2, 3]  # every 2 and the end (ceil(24 / 8) = 3)
    metrics = [c.metrics.model_dump(exclude_none=True) for c in ckpts]  # the SDK's model
    for c, m in zip(ckpts, metrics, strict=True):
        assert set(m) == {"step", "valid_loss", "epsilon"}  # no training-data statistics
        assert m["epsilon"] == c.model_extra["epsilon"] > 0 and m["step"] == c.step_number
        assert m["valid_loss"] > 0
    results = [f for f in job.result_files if f not in {c.model_extra["file_id"] for c in ckpts}]
    assert len(results) == 1
    info = client.files.retrieve(results[0])
    assert info.purpose == "fine-tune-results" and info.filename == f"{job.id}-results.csv"
    rows = read_results(client.files.content(results[0]).text)
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    steps = sorted(
        (e.data for e in events if e.message.startswith("Step ")), key=lambda d: d["step"]
    )
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row, data in zip(rows, steps, strict=True):
        assert row["epsilon"] == data["epsilon_spent"]
        assert row["valid_loss"] == data.get("valid_loss")
        for column in ("train_loss", "clipped_fraction", "batch_size", "dropped"):
            assert row[column] is None and column not in data  # not reported
    assert [r["valid_loss"] for r in rows if r["valid_loss"] is not None] == [
        m["valid_loss"] for m in metrics
    ]
    # another tenant cannot read the results file
    other = embedded.client(embedded.key("valid-other"))
    with pytest.raises(openai.NotFoundError):
        other.files.content(results[0])


def test_validation_files_that_are_refused(embedded):
    client = embedded.client(embedded.key("valid-refusals"))
    other = embedded.client(embedded.key("valid-stranger"))
    train = client.files.create(file=("t.jsonl", learnable_lines(24)), purpose="fine-tune")
    theirs = other.files.create(file=("v.jsonl", learnable_lines(5)), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError) as info:
        _job(client, train.id, theirs.id)
    assert info.value.body["param"] == "validation_file"
    with pytest.raises(openai.BadRequestError, match="is the training file"):
        _job(client, train.id, train.id)
    budgeted = client.files.create(
        # lines of its own: lines shared with the training file would join that data set
        file=("b.jsonl", b'{"text": "budgeted one"}\n{"text": "budgeted two"}\n'),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 3},
    )
    with pytest.raises(openai.BadRequestError, match="has a privacy budget"):
        _job(client, train.id, budgeted.id)
    labelled = client.files.create(
        file=("c.jsonl", b'{"text": "a b", "label": 1}\n{"text": "c d", "label": 0}\n'),
        purpose="fine-tune",
    )
    with pytest.raises(openai.BadRequestError, match="classification"):
        _job(client, train.id, labelled.id)
    assert client.fine_tuning.jobs.list().data == []  # nothing was created
