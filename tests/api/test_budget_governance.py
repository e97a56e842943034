"""Budgets that bind the people who spend them (docs/governance.md), over uvicorn on
PostgreSQL and SQLite with the default policy (a budget is required): only a data owner or an
admin sets or moves a budget, with a reason, audited; uploads that share examples share one
budget, also after a deletion; uploads name their budget strictly. (A trainer's upload waits
for a data owner: tests/api/test_upload_approval.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from dprc_core.accounting import epsilon_for_events
from service.jobs import job_runs
from tests.api.conftest import Server, _serve, _settings, exact_job_body, exact_job_event, jsonl


def _lines(n: int, tag: str = "r") -> bytes:
    return jsonl([{"text": f"{tag} note {i} of a patient", "label": i % 2} for i in range(n)])


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def gov(request, pg_url, tmp_path_factory) -> Iterator[Server]:
    """The API with the shipped budget policy (DPRC_REQUIRE_BUDGET on, no default)."""
    tmp = tmp_path_factory.mktemp(f"gov-{request.param}")
    url = pg_url if request.param == "postgresql" else None
    yield from _serve(_settings(tmp, url, require_budget=True))


def _upload(http, data: bytes, **fields: str):
    return http.post(
        "/v1/files", files={"file": ("d.jsonl", data)}, data={"purpose": "fine-tune", **fields}
    )


def _budget(http, file_id: str) -> dict:
    r = http.get(f"/v1/files/{file_id}")
    assert r.status_code == 200, r.text
    return r.json()["budget"]


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def _audit(http, **params) -> list[dict]:
    r = http.get("/v1/organization/audit_logs", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_only_an_admin_moves_a_budget_with_a_reason(gov):
    admin, trainer = gov.key("owner", "admin"), gov.key("owner", "trainer")
    with (
        gov.http(admin) as adm,
        gov.http(trainer) as tr,
        gov.http(gov.key("owner", "data_owner")) as own,
    ):
        f = _upload(own, _lines(100), epsilon_budget="1").json()
        assert f["budget"]["epsilon"] == 1.0 and f["created_by"] is not None
        job = tr.post("/v1/fine_tuning/jobs", json=exact_job_body(f["id"], 0.9))
        assert job.status_code == 200, job.text
        before = _budget(tr, f["id"])
        # the spender cannot raise ε, nor δ alone (which would lower the composed ε)
        for body in (
            {"epsilon_budget": 100, "reason": "more"},
            {"delta": 0.009, "reason": "more"},
            {"epsilon_budget": 0.5, "reason": "less"},
        ):
            err = _error(tr.post(f"/v1/files/{f['id']}/budget", json=body), 403)
            assert err["code"] == "permission_denied"
        with gov.http(gov.key("owner", "viewer")) as viewer:
            _error(viewer.post(f"/v1/files/{f['id']}/budget", json={"epsilon_budget": 9}), 403)
        assert _budget(tr, f["id"]) == before
        assert (
            _error(tr.post("/v1/fine_tuning/jobs", json=exact_job_body(f["id"], 0.9)), 409)["code"]
            == "budget_exceeded"
        )
        # an admin needs a reason
        for body in ({"epsilon_budget": 3}, {"epsilon_budget": 3, "reason": "   "}):
            assert _error(adm.post(f"/v1/files/{f['id']}/budget", json=body), 400)["param"] == (
                "reason"
            )
        assert _budget(tr, f["id"]) == before
        r = adm.post(
            f"/v1/files/{f['id']}/budget",
            json={"epsilon_budget": 3, "reason": "second study approved by the DPO"},
            headers={"X-Request-ID": "req-budget-raise"},
        )
        assert r.status_code == 200, r.text
        after = r.json()["budget"]
        assert after["epsilon"] == 3.0 and after["delta"] == before["delta"]  # δ kept
        entries = _audit(adm, action="budget.change")
        assert len(entries) == 1
        e = entries[0]
        assert e["resource"] == f["budget_group"] and e["request_id"] == "req-budget-raise"
        assert e["role"] == "admin" and e["key_id"] is not None
        assert e["detail"]["before"] == {"epsilon": 1.0, "delta": before["delta"]}
        assert e["detail"]["after"] == {"epsilon": 3.0, "delta": before["delta"]}
        assert e["detail"]["reason"] == "second study approved by the DPO"
        # a lowering that the committed job no longer fits is 409, and changes nothing
        low = {"epsilon_budget": 0.5, "reason": "tighten"}
        assert _error(adm.post(f"/v1/files/{f['id']}/budget", json=low), 409)
        assert _budget(tr, f["id"])["epsilon"] == 3.0
        # δ above 1/N is refused
        big = {"delta": 0.05, "reason": "x"}
        assert _error(adm.post(f"/v1/files/{f['id']}/budget", json=big), 400)["param"] == "delta"
        assert len(_audit(adm, action="budget.change")) == 1
        # the job's creation and the upload were recorded with their keys
        created = _audit(adm, action="job.create")
        assert [x["resource"] for x in created] == [job.json()["id"]]
        assert created[0]["role"] == "trainer"
        assert job.json()["created_by"] == created[0]["key_id"]


def test_uploads_that_share_examples_share_one_budget(gov):
    key = gov.key("sharing", "admin")  # an admin holds the data owner's rights
    with gov.http(key) as http:
        first = _upload(http, _lines(100), epsilon_budget="2").json()
        assert first["joined_budget_group"] is False
        r = http.post("/v1/fine_tuning/jobs", json=exact_job_body(first["id"], 1.5))
        assert r.status_code == 200, r.text
        charged = exact_job_event(r.json())
        # a byte-identical re-upload and a superset join the group and take its budget
        again = _upload(http, _lines(100)).json()
        superset = _upload(http, _lines(100) + _lines(20, tag="new")).json()
        for f in (again, superset):
            assert f["joined_budget_group"] is True
            assert f["budget_group"] == first["budget_group"]
            assert f["budget"]["epsilon"] == 2.0
            assert f["budget"]["committed"] == pytest.approx(
                epsilon_for_events([charged], f["budget"]["delta"]), rel=1e-6
            )
        # a job that a fresh budget of 2 would take (1.5 < 2) is refused: the group composes
        fresh_fit = exact_job_body(superset["id"], 1.5)
        err = _error(http.post("/v1/fine_tuning/jobs", json=fresh_fit), 409)
        assert err["code"] == "budget_exceeded" and first["budget_group"] in err["message"]
        # asking for another budget on shared data is 409 naming the group
        err = _error(_upload(http, _lines(100), epsilon_budget="50"), 409)
        assert err["code"] == "budget_group_conflict" and first["budget_group"] in err["message"]
        # ... and so is declaring it validation-only
        err = _error(_upload(http, _lines(10), unbudgeted="true"), 409)
        assert err["code"] == "budget_group_conflict"
        # other data starts a budget of its own
        other = _upload(http, _lines(100, tag="other"), epsilon_budget="2").json()
        assert other["joined_budget_group"] is False
        assert other["budget_group"] != first["budget_group"]


def test_delete_then_reupload_keeps_the_spent_epsilon(gov):
    key = gov.key("deleter", "admin")
    with gov.http(key) as http:
        f = _upload(http, _lines(100), epsilon_budget="3").json()
        job = http.post("/v1/fine_tuning/jobs", json=exact_job_body(f["id"], 2.0)).json()
        # the worker's side: it runs 4 steps and ends (cancelled)
        assert job_runs.start_job(gov.store, job["id"], "w")
        job_runs.record_progress(gov.store, job["id"], 4, 0.1, {})
        job_runs.end_job(gov.store, job["id"], "cancelled")
        spent = _budget(http, f["id"])["spent"]
        assert spent > 0
        assert http.delete(f"/v1/files/{f['id']}").json()["deleted"] is True
        gone = http.get(f"/v1/files/{f['id']}").json()
        assert gone["deleted"] is True and gone["budget"]["spent"] == pytest.approx(spent)
        assert _error(http.get(f"/v1/files/{f['id']}/content"), 404)["code"] == "file_deleted"
        hist = http.get(f"/v1/files/{f['id']}/budget/history").json()
        assert [p["job_id"] for p in hist["data"]] == [job["id"]]
        assert f["id"] not in [x["id"] for x in http.get("/v1/files").json()["data"]]
        listed = http.get("/v1/files", params={"include_deleted": "true"}).json()["data"]
        assert f["id"] in [x["id"] for x in listed]
        # no new job on the deleted file
        assert _error(http.post("/v1/fine_tuning/jobs", json=exact_job_body(f["id"], 0.1)), 404)
        back = _upload(http, _lines(100)).json()
        assert back["budget_group"] == f["budget_group"]
        assert back["budget"]["spent"] == pytest.approx(spent)
        assert back["budget"]["epsilon"] == 3.0


def test_an_upload_names_its_budget_strictly(gov):
    key = gov.key("strict", "admin")  # an admin holds the data owner's rights
    with gov.http(key) as http:
        # naming no budget where one is required: the upload waits for a decision (it was 400
        # budget_required before data owners approved uploads)
        waiting = _upload(http, _lines(50, tag="unnamed"))
        assert waiting.status_code == 200, waiting.text
        assert waiting.json()["approval"]["status"] == "pending"
        assert waiting.json()["budget"] is None
        assert http.delete(f"/v1/files/{waiting.json()['id']}").status_code == 200
        assert _error(_upload(http, _lines(50), epsilon_budget=""), 400)["param"] == (
            "epsilon_budget"
        )
        err = _error(_upload(http, _lines(50), budget="1"), 400)  # a misspelled field
        assert err["param"] == "budget" and err["code"] == "unknown_field"
        for bad in ("true", " 8 ", "1_0", "7x", "0", "-1", "inf", "nan", "101", "1e400"):
            err = _error(_upload(http, _lines(50), epsilon_budget=bad), 400)
            assert err["param"] == "epsilon_budget", bad
        for bad in ("5e-324", "0", "1", "true", "1e-400"):
            err = _error(_upload(http, _lines(50), epsilon_budget="1", delta=bad), 400)
            assert err["param"] == "delta", bad
        assert (
            _error(_upload(http, _lines(50), epsilon_budget="1", delta="0.5"), 400)["param"]
            == "delta"
        )  # above 1/N
        err = _error(_upload(http, _lines(50), unbudgeted="yes"), 400)
        assert err["param"] == "unbudgeted"
        assert http.get("/v1/files").json()["data"] == []  # nothing was stored
        ok = _upload(http, _lines(50), epsilon_budget="1.5e0", delta="1e-3").json()
        assert ok["budget"]["epsilon"] == 1.5 and ok["budget"]["delta"] == 0.001
        # validation-only data: no budget, and no job trains on it
        valid = _upload(http, _lines(20, tag="held-out"), unbudgeted="true").json()
        assert valid["budget"] is None and valid["unbudgeted"] is True
        err = _error(http.post("/v1/fine_tuning/jobs", json=exact_job_body(valid["id"], 1)), 400)
        assert err["param"] == "training_file"
    admin = gov.key("strict", "admin")
    with gov.http(admin) as http:  # the budget endpoint's JSON is as strict
        fid = ok["id"]
        for bad in (True, "7", " 8 ", None):
            body = {"epsilon_budget": bad, "reason": "r"}
            if bad is None:
                body = {"reason": "r"}  # names nothing
            assert _error(http.post(f"/v1/files/{fid}/budget", json=body), 400)["param"] == (
                "epsilon_budget"
            )
        extra = {"epsilon_budget": 2, "reason": "r", "budget": 1}
        assert _error(http.post(f"/v1/files/{fid}/budget", json=extra), 400)["param"] == "budget"
        assert _budget(http, fid)["epsilon"] == 1.5


def test_a_default_budget_applies_to_uploads_that_name_none(pg_url, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gov-default")
    for srv in _serve(_settings(tmp, None, require_budget=True, default_epsilon_budget=4.0)):
        trainer = srv.key("defaulted", "trainer")
        client = srv.client(trainer)
        # the official client's plain upload by a data owner: the tenant's default, echoed
        owner = srv.client(srv.key("defaulted", "data_owner"))
        f = owner.files.create(file=("d.jsonl", _lines(100)), purpose="fine-tune")
        assert f.model_extra["budget"]["epsilon"] == 4.0
        assert f.model_extra["budget_default"] is True
        # the openai client's job flow still works with a trainer key
        job = client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=f.id,
            hyperparameters={"n_epochs": 1, "batch_size": 20},
            extra_body={"privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}}},
        )
        assert job.model_extra["created_by"] is not None
        assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
        assert client.fine_tuning.jobs.list_events(job.id).data
        assert client.fine_tuning.jobs.checkpoints.list(job.id).data == []
        assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
        viewer = srv.client(srv.key("defaulted", "viewer"))
        assert viewer.files.retrieve(f.id).id == f.id
        with pytest.raises(openai.PermissionDeniedError):
            viewer.files.create(file=("e.jsonl", _lines(10, "v")), purpose="fine-tune")
        with pytest.raises(openai.PermissionDeniedError):
            viewer.fine_tuning.jobs.cancel(job.id)
