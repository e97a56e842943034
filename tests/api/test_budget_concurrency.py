"""Budgets under concurrency: 20 simultaneous job creations against one budgeted file on
PostgreSQL never commit more than the budget (checked by composing the accepted jobs' events
with the accountant), and retried creates with one Idempotency-Key yield one job."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from dprc_core.accounting import PrivacyEvent, epsilon_for_events
from tests.api.conftest import labelled_lines

BUDGET = 3.0
JOB = {
    "model": "minilm-l6-v2",
    "hyperparameters": {"n_epochs": 1, "batch_size": 20},
    "privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}},
}


def _event(job: dict) -> PrivacyEvent:
    p = job["privacy"]
    return PrivacyEvent(
        p["noise_multiplier"],
        p["sample_rate"],
        p["steps"],
        p["accountant"]["clipping"],
        p["accountant"]["k"],
    )


def _race(server, tenant: str) -> None:
    key = server.key(tenant)
    client = server.client(key)
    f = client.files.create(
        file=("d.jsonl", labelled_lines(200)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": str(BUDGET)},
    )
    delta = f.model_extra["budget"]["delta"]

    def create(_i: int) -> httpx.Response:
        with server.http(key) as http:
            return http.post("/v1/fine_tuning/jobs", json={**JOB, "training_file": f.id})

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(create, range(20)))
    codes = sorted(r.status_code for r in responses)
    accepted = [r.json() for r in responses if r.status_code == 200]
    refused = [r.json() for r in responses if r.status_code == 409]
    assert len(accepted) + len(refused) == 20, codes
    assert accepted and refused, codes
    for r in refused:
        assert r["error"]["code"] == "budget_exceeded"
        assert "remaining epsilon=" in r["error"]["message"]
    events = [_event(j) for j in accepted]
    composed = epsilon_for_events(events, delta)
    # the service composes the file's history on its own grid (within 0.1% of this one)
    assert composed <= BUDGET * (1 + 1e-3)
    # refusals were needed: one more such job would not have fit
    assert epsilon_for_events(events + [events[0]], delta) > BUDGET
    # and the accounting is a composition, not a sum: more than BUDGET / 1.0 jobs fit
    assert len(accepted) > BUDGET
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["committed"] <= BUDGET
    assert len(client.fine_tuning.jobs.list(limit=100).data) == len(accepted)


def test_twenty_concurrent_reservations_postgresql(pg_server):
    assert pg_server.store.engine.dialect.name == "postgresql"
    _race(pg_server, "race-pg")


def test_twenty_concurrent_reservations_sqlite(sqlite_server):
    assert sqlite_server.store.engine.dialect.name == "sqlite"
    _race(sqlite_server, "race-sqlite")


def test_idempotency_key(server):
    key = server.key("idem")
    client = server.client(key)
    f = client.files.create(
        file=("d.jsonl", labelled_lines(200)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "5"},
    )
    body = {**JOB, "training_file": f.id}

    def create(_i: int) -> httpx.Response:
        with server.http(key) as http:
            return http.post(
                "/v1/fine_tuning/jobs", json=body, headers={"Idempotency-Key": "retry-1"}
            )

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(create, range(8)))
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(client.fine_tuning.jobs.list().data) == 1
    # reserved once: the committed ε is the ε of one job
    job = responses[0].json()
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["committed"] == epsilon_for_events([_event(job)], budget["delta"])
    # the SDK's own retry path: same key, same job
    again = client.fine_tuning.jobs.create(
        **{k: v for k, v in body.items() if k != "privacy"},
        extra_body={"privacy": JOB["privacy"]},
        extra_headers={"Idempotency-Key": "retry-1"},
    )
    assert again.id == job["id"]
    # the key with another request is a conflict
    with server.http(key) as http:
        r = http.post(
            "/v1/fine_tuning/jobs", json={**body, "seed": 3}, headers={"Idempotency-Key": "retry-1"}
        )
    assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_key_reused"


def test_cancel_releases_reservation(server):
    client = server.client(server.key("release"))
    f = client.files.create(
        file=("d.jsonl", labelled_lines(200)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "1.1"},
    )
    body = {**JOB, "training_file": f.id}
    kwargs = {k: v for k, v in body.items() if k != "privacy"}
    first = client.fine_tuning.jobs.create(**kwargs, extra_body={"privacy": JOB["privacy"]})
    with pytest.raises(openai.ConflictError) as err:
        client.fine_tuning.jobs.create(**kwargs, extra_body={"privacy": JOB["privacy"]})
    assert "remaining" in err.value.message
    client.fine_tuning.jobs.cancel(first.id)
    second = client.fine_tuning.jobs.create(**kwargs, extra_body={"privacy": JOB["privacy"]})
    assert second.status == "queued"
