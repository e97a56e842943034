"""A budgeted file's composition is incremental through the service (issue 16, item 2): with
20 jobs of distinct σ on a file, creating one more job or cancelling one composes O(log n)
PLD blocks — counted on the history's block composition (``dp_accounting``'s, its truncation
vectorised), not timed — and the file's committed ε
stays the composition of its events (within the discretisation of a full composition)."""

from __future__ import annotations

import math

import pytest

from dprc_core.accounting import epsilon_for_events, history
from dprc_core.accounting.history import clear_cache
from tests.api.conftest import exact_job_body, exact_job_event, labelled_lines
from tests.call_counts import count_calls

OLDER = 20


def test_one_more_job_composes_log_n_blocks(server, monkeypatch):
    key = server.key(f"incremental-{server.store.engine.dialect.name}")
    client = server.client(key)
    f = client.files.create(
        file=("d.jsonl", labelled_lines(200)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "30"},
    )
    clear_cache()  # the other database's run composed the very same events
    jobs = []
    with server.http(key) as http:
        for i in range(OLDER):  # distinct σ: no two events merge into one
            r = http.post("/v1/fine_tuning/jobs", json=exact_job_body(f.id, 0.3 + 0.01 * i))
            assert r.status_code == 200, r.text
            jobs.append(r.json())

        calls = count_calls(monkeypatch, history, "compose")
        r = http.post("/v1/fine_tuning/jobs", json=exact_job_body(f.id, 0.55))
        assert r.status_code == 200, r.text
        jobs.append(r.json())
        bound = 2 * math.ceil(math.log2(len(jobs)))
        assert 1 <= calls["compose"] <= bound, calls  # a full composition makes ≥ OLDER

        calls["compose"] = 0
        r = http.post(f"/v1/fine_tuning/jobs/{jobs[5]['id']}/cancel")
        assert r.status_code == 200, r.text
        assert calls["compose"] <= bound, calls  # its slot empties: O(log n) blocks again
        monkeypatch.undo()

    budget = client.files.retrieve(f.id).model_extra["budget"]
    events = [exact_job_event(j) for i, j in enumerate(jobs) if i != 5]
    assert budget["committed"] == pytest.approx(
        epsilon_for_events(events, budget["delta"]), rel=1e-3
    )
