"""Issue 40 through uvicorn and the official ``openai`` client, on PostgreSQL and SQLite: a
job's default δ is its budget group's (the data set's page and the job's state one (ε, δ)); a
δ above the budget's is refused; a δ above 1/(10·N) is warned about on the job object and by
`dprc jobs get`; a classification validation label the training file lacks is refused at
create."""

from __future__ import annotations

import openai
import pytest

from dprc_core.training.plan import default_delta
from tests.api.conftest import exact_job_body, jsonl, run_cli


def _reviews(n: int, start: int = 0) -> list[dict]:
    return [{"text": f"review {i} was {'good' if i % 2 else 'bad'}", "label": i % 2}
            for i in range(start, start + n)]  # fmt: skip


def test_a_jobs_default_delta_is_its_budget_groups_and_a_larger_one_is_refused(server, monkeypatch):
    key = server.key("one-delta")
    client = server.client(key)
    whole = client.files.create(
        file=("all.jsonl", jsonl(_reviews(200))),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "8"},
    )
    budget_delta = whole.model_extra["budget"]["delta"]
    assert budget_delta == default_delta(200)
    # a 50-line subset joins the same budget group (it shares its examples)
    subset = client.files.create(file=("sub.jsonl", jsonl(_reviews(50))), purpose="fine-tune")
    assert subset.model_extra["budget_group"] == whole.model_extra["budget_group"]
    assert subset.model_extra["budget"]["delta"] == budget_delta

    body = exact_job_body(subset.id, 2.0)
    job = client.fine_tuning.jobs.create(
        model=body["model"],
        training_file=subset.id,
        hyperparameters=body["hyperparameters"],
        extra_body={"privacy": body["privacy"]},
    )
    privacy = job.model_extra["privacy"]
    assert privacy["dataset_size"] == 50
    # the budget's δ, not the subset's own 1/50^1.1 (7x larger)
    assert privacy["target_delta"] == budget_delta != default_delta(50)
    ledger = server.http(key).get(f"/v1/fine_tuning/jobs/{job.id}/ledger").json()
    assert ledger["delta"] == budget_delta
    # δ = 1/200^1.1 is above 1/(10·50): the job object warns
    assert [w["code"] for w in privacy["warnings"]] == ["delta_large"]
    assert "N = 50 examples" in privacy["warnings"][0]["message"]
    # and `dprc jobs get` shows it
    monkeypatch.setenv("DPRC_API_KEY", key)
    status, said, err = run_cli("jobs", "get", job.id, "--server", server.base_url)
    assert status == 0, err
    assert "delta_large: delta=" in said and "N = 50 examples" in said

    # a job naming a δ above the budget's is refused, naming the field
    with pytest.raises(openai.BadRequestError) as info:
        client.fine_tuning.jobs.create(
            model=body["model"],
            training_file=subset.id,
            hyperparameters=body["hyperparameters"],
            extra_body={"privacy": {**body["privacy"], "target_delta": 2 * budget_delta}},
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == "privacy.target_delta"
    assert info.value.body["code"] == "invalid_delta"
    # a smaller one is taken (its ε at that δ bounds the ε at the budget's), without a warning
    small = client.fine_tuning.jobs.create(
        model=body["model"],
        training_file=subset.id,
        hyperparameters=body["hyperparameters"],
        extra_body={"privacy": {**body["privacy"], "target_delta": 1e-3}},
    )
    assert small.model_extra["privacy"]["target_delta"] == 1e-3
    assert small.model_extra["privacy"]["warnings"] == []


def test_a_validation_label_the_training_file_lacks_is_refused_at_create(server):
    client = server.client(server.key("valid-labels"))
    train = client.files.create(
        file=("t.jsonl", jsonl(_reviews(40))),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "8"},
    )
    extra = [{"text": f"held-out review {i}", "label": i % 3} for i in range(9)]  # label 2
    valid = client.files.create(file=("v.jsonl", jsonl(extra)), purpose="fine-tune")
    body = exact_job_body(train.id, 2.0)
    with pytest.raises(openai.BadRequestError) as info:
        client.fine_tuning.jobs.create(
            model=body["model"],
            training_file=train.id,
            hyperparameters=body["hyperparameters"],
            extra_body={"privacy": body["privacy"], "validation_file": valid.id},
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["code"] == "invalid_validation_file"
    assert info.value.body["param"] == "validation_file"
    assert "label '2'" in info.value.body["message"]
    # labels the training file has (as strings: the worker's classes compare them so) pass
    same = [{"text": f"another review {i}", "label": str(i % 2)} for i in range(6)]
    ok = client.files.create(file=("ok.jsonl", jsonl(same)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=body["model"],
        training_file=train.id,
        hyperparameters=body["hyperparameters"],
        extra_body={"privacy": body["privacy"], "validation_file": ok.id},
    )
    assert job.validation_file == ok.id
