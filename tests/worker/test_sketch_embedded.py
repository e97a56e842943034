"""A per-example-sketch job runs end to end in the embedded worker (SQLite, no broker): the
worker hands the request's sketch to the runner, whose ledger and ε are the per-example ones."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from dprc_core.accounting import PrivacyEvent, PrivacyLedger, epsilon
from tests.worker.conftest import learnable_lines, wait_for


def test_a_per_example_job_runs_and_its_ledgers_say_so(embedded):
    client = embedded.client(embedded.key("sketch-run"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(32)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32},
        extra_body={
            "privacy": {
                "target_epsilon": 2.0,
                "clipping": {"method": "hutch", "k": 32, "sketch": "per_example"},
            }
        },
    )
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.model_extra.get("error") or job
    priv = job.model_extra["privacy"]
    sigma, q, delta, steps = (
        priv["noise_multiplier"],
        priv["sample_rate"],
        priv["target_delta"],
        priv["steps"],
    )
    assert steps == 4 and job.model_extra["steps_done"] == 4  # ⌈32 / 8⌉
    want = epsilon(sigma, q, steps, delta, "hutch", 32, sketch="per_example")
    shared = epsilon(sigma, q, steps, delta, "hutch", 32)
    assert want < shared
    # ε spent is the runner's (the worker reports its ledger): the per-example one
    assert priv["epsilon_spent"] == pytest.approx(want, rel=1e-9)

    # the service's ledger of the steps that ran
    ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert [e["sketch"] for e in ledger["ledger"]["events"]] == ["per_example"]
    assert ledger["epsilon_spent"] == pytest.approx(want, rel=1e-9)

    # the runner's ledger in the released checkpoint
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    last = max(ckpts, key=lambda c: c.step_number)
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("ledger.json")
        assert member is not None
        text = member.read().decode()
    assert {e.get("sketch") for e in json.loads(text)["events"]} == {"per_example"}
    run_ledger = PrivacyLedger.from_json(text)
    assert sum(e.steps for e in run_ledger.events) == 4
    assert all(
        e == PrivacyEvent(sigma, q, e.steps, "hutch", 32, sketch="per_example")
        for e in run_ledger.events
    )

    # the budget settled to what ran, with the per-example event
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0
    assert budget["spent"] == pytest.approx(
        epsilon(sigma, q, steps, budget["delta"], "hutch", 32, sketch="per_example"), rel=1e-3
    )
