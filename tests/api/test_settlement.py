"""A job's reservation settles to the steps that ran, through the worker-side service
functions (start with a lease, progress, end), seen over HTTP."""

from __future__ import annotations

import json

import openai
import pytest

from dprc_core.accounting import PrivacyEvent, PrivacyLedger, epsilon_for_events
from service.jobs import job_runs as jobs
from tests.api.conftest import labelled_lines


def test_reservation_settles_to_steps_run(server):
    client = server.client(server.key("settle"))
    f = client.files.create(
        file=("d.jsonl", labelled_lines(100)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "3"},
    )
    job = client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=f.id,
        hyperparameters={"n_epochs": 2, "batch_size": 10},
        extra_body={
            "privacy": {
                "target_epsilon": 2.0,
                "clipping": {"method": "exact"},
                "report_train_loss": False,
            }
        },
    )
    p = job.model_extra["privacy"]
    assert p["steps"] == 20
    assert jobs.start_job(server.store, job.id, "worker-1")
    assert not jobs.start_job(server.store, job.id, "worker-2")  # live lease held by worker-1
    running = client.fine_tuning.jobs.retrieve(job.id)
    assert running.status == "running"

    done = 7
    delta = p["target_delta"]
    spent_event = PrivacyEvent(p["noise_multiplier"], p["sample_rate"], done)
    eps_done = epsilon_for_events([spent_event], delta)
    jobs.record_progress(server.store, job.id, done, eps_done, {"train_loss": 0.7})
    events = client.fine_tuning.jobs.list_events(job.id).data
    assert events[0].type == "metrics" and events[0].data["step"] == done
    assert "train_loss" not in events[0].data  # report_train_loss: false

    # a running job is asked to stop; the worker ends it
    asked = client.fine_tuning.jobs.cancel(job.id)
    assert asked.status == "running" and asked.model_extra["cancel_requested"] is True
    jobs.end_job(server.store, job.id, "cancelled")

    ended = client.fine_tuning.jobs.retrieve(job.id)
    assert ended.status == "cancelled" and ended.finished_at is not None
    assert ended.model_extra["privacy"]["epsilon_spent"] == eps_done
    budget = client.files.retrieve(f.id).model_extra["budget"]
    file_delta = budget["delta"]
    settled = epsilon_for_events([spent_event], file_delta)
    assert budget["spent"] == pytest.approx(settled)
    assert budget["committed"] == pytest.approx(settled)  # no reservation left
    ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert PrivacyLedger.from_json(json.dumps(ledger["ledger"])).events == (spent_event,)
    assert ledger["epsilon_spent"] == pytest.approx(eps_done)
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"  # idempotent


def test_ended_job_cannot_be_cancelled(server):
    client = server.client(server.key("ended"))
    f = client.files.create(file=("d.jsonl", labelled_lines(100)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=f.id,
        extra_body={"privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}}},
    )
    assert jobs.start_job(server.store, job.id, "w")
    jobs.record_progress(server.store, job.id, job.model_extra["steps_total"], 1.0)
    jobs.end_job(server.store, job.id, "succeeded")
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.cancel(job.id)
    assert client.fine_tuning.jobs.retrieve(job.id).status == "succeeded"
