"""The data owner owns budgets (issue 40), over uvicorn on PostgreSQL and SQLite with the
shipped policy (a budget required, no default): copies the model cannot tell apart join the
original's budget; a trainer's upload waits for an owner, who approves it (a new budget or a
join) or rejects it, audited; the tenant's policy may let trainers budget their own uploads."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator

import openai
import pytest

from tests.api.conftest import Server, _serve, _settings, exact_job_body


def _rows(n: int, tag: str = "r") -> list[dict]:
    return [
        {"text": f"Patient {tag} note {i} reports a mild cough", "label": i % 2} for i in range(n)
    ]


def _jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def srv(request, pg_url, tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"approval-{request.param}")
    url = pg_url if request.param == "postgresql" else None
    yield from _serve(_settings(tmp, url, require_budget=True))


def _upload(http, data: bytes, **fields: str):
    return http.post(
        "/v1/files", files={"file": ("d.jsonl", data)}, data={"purpose": "fine-tune", **fields}
    )


def _ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


# Edits a tokenizer cannot see (issue 40's first finding, and the invisible characters)
INVISIBLE_EDITS = {
    "trailing spaces": lambda t: t + "   ",
    "lower-cased": str.lower,
    "first letter's case swapped": lambda t: t[0].swapcase() + t[1:],
    "doubled spaces": lambda t: t.replace(" ", "  "),
    "no-break spaces": lambda t: t.replace(" ", "\u00a0"),
    "zero-width spaces": lambda t: t.replace("note", "no\u200bte"),
    "full-width letters": lambda t: unicodedata.normalize("NFC", t).replace("P", "\uff30"),
}


def test_copies_the_model_cannot_tell_apart_join_the_original_budget(srv):
    owner = srv.key("edits", "admin")
    with srv.http(owner) as http:
        rows = _rows(60)
        first = _ok(_upload(http, _jsonl(rows), epsilon_budget="3"))
        _ok(http.post("/v1/fine_tuning/jobs", json=exact_job_body(first["id"], 2.5)))
        for name, edit in INVISIBLE_EDITS.items():
            copy = [{**r, "text": edit(r["text"])} for r in rows]
            assert _jsonl(copy) != _jsonl(rows), name
            # naming a fresh budget for it is refused: it is the same data set
            err = _error(_upload(http, _jsonl(copy), epsilon_budget="50"), 409)
            assert err["code"] == "budget_group_conflict", name
            joined = _ok(_upload(http, _jsonl(copy)))
            assert joined["budget_group"] == first["budget_group"], name
            assert joined["joined_budget_group"] is True, name
            # an ε 2.5 job on the copy is over the group's budget, as on the original
            err = _error(
                http.post("/v1/fine_tuning/jobs", json=exact_job_body(joined["id"], 2.5)), 409
            )
            assert err["code"] == "budget_exceeded", name
        # an edit the model does see is new data (a person decides: the approval below)
        changed = [{**r, "text": r["text"].replace("cough", "fever")} for r in rows]
        other = _ok(_upload(http, _jsonl(changed), epsilon_budget="3"))
        assert other["budget_group"] != first["budget_group"]


def test_a_trainers_upload_waits_for_a_data_owner(srv):
    trainer, owner, admin = (srv.key("queue", r) for r in ("trainer", "data_owner", "admin"))
    rows = _rows(40, "q")
    with srv.http(trainer) as tr, srv.http(owner) as own, srv.http(admin) as adm:
        base = _ok(_upload(own, _jsonl(rows), epsilon_budget="2"))
        assert base["approval"]["status"] == "approved" and base["budget"]["epsilon"] == 2.0
        # its default δ (1/40^1.1 = 0.0173) is above 1/(10·40): the file says so
        assert base["budget"]["delta"] > 1 / 400
        assert [w["code"] for w in base["budget"]["warnings"]] == ["delta_large"]
        # a trainer's upload, even naming a budget, mints nothing: it waits
        asked = _ok(_upload(tr, _jsonl(_rows(30, "fresh")), epsilon_budget="50"))
        assert asked["approval"]["status"] == "pending" and asked["budget"] is None
        assert asked["approval"]["requested_budget"] == {"epsilon": 50.0, "delta": None}
        assert asked["approval"]["report"]["groups"] == []
        err = _error(tr.post("/v1/fine_tuning/jobs", json=exact_job_body(asked["id"], 1)), 409)
        assert err["code"] == "pending_approval" and "data_owner" in err["message"]
        # a near copy of the owner's data: the report names the group and the overlap
        near = rows[:25] + _rows(5, "extra")
        near_copy = _ok(_upload(tr, _jsonl([{**r, "text": r["text"].upper()} for r in near])))
        report = near_copy["approval"]["report"]
        assert report["distinct_examples"] == 30 and report["groups_total"] == 1
        assert report["groups"][0]["budget_group"] == base["budget_group"]
        assert report["groups"][0]["shared_examples"] == 25
        # the owner's queue
        queue = _ok(own.get("/v1/files", params={"approval": "pending"}))["data"]
        assert {f["id"] for f in queue} == {asked["id"], near_copy["id"]}
        # only a data owner or an admin decides
        for who in (tr, srv.http(srv.key("queue", "viewer"))):
            body = {"epsilon_budget": 1, "reason": "mine"}
            assert _error(who.post(f"/v1/files/{asked['id']}/approve", json=body), 403)
            assert _error(who.post(f"/v1/files/{asked['id']}/reject", json={"reason": "x"}), 403)
        assert (
            _error(own.post(f"/v1/files/{asked['id']}/approve", json={"epsilon_budget": 1}), 400)[
                "param"
            ]
            == "reason"
        )
        # the near copy cannot start a budget of its own: it shares examples with one
        err = _error(
            own.post(
                f"/v1/files/{near_copy['id']}/approve", json={"epsilon_budget": 3, "reason": "r"}
            ),
            409,
        )
        assert err["code"] == "budget_group_conflict" and base["budget_group"] in err["message"]
        err = _error(
            own.post(
                f"/v1/files/{near_copy['id']}/approve",
                json={"budget_group": base["budget_group"], "unit": "user", "reason": "r"},
            ),
            400,
        )
        assert err["code"] == "privacy_unit_mismatch"
        joined = _ok(
            own.post(
                f"/v1/files/{near_copy['id']}/approve",
                json={"budget_group": base["budget_group"], "reason": "same study, re-exported"},
            )
        )
        assert joined["approval"]["status"] == "approved"
        assert joined["budget_group"] == base["budget_group"] and joined["budget"]["epsilon"] == 2.0
        assert joined["approval"]["decided_by"] is not None
        # decided once: a second decision is 409
        again = own.post(f"/v1/files/{near_copy['id']}/reject", json={"reason": "late"})
        assert _error(again, 409)["code"] == "not_pending"
        # the new data: approved as its own data set, at the owner's ε (not the asked 50)
        approved = _ok(
            own.post(
                f"/v1/files/{asked['id']}/approve",
                json={"epsilon_budget": 1.5, "delta": 1e-3, "unit": "example", "reason": "IRB 7"},
            )
        )
        assert approved["budget"]["epsilon"] == 1.5 and approved["budget"]["delta"] == 1e-3
        assert approved["budget"]["warnings"] == []  # 1e-3 <= 1/(10·30)
        assert approved["budget_group"] not in (None, base["budget_group"])
        _ok(tr.post("/v1/fine_tuning/jobs", json=exact_job_body(asked["id"], 0.5)))
        # a rejected upload: content gone, record kept
        junk = _ok(_upload(tr, _jsonl(_rows(10, "junk"))))
        gone = _ok(own.post(f"/v1/files/{junk['id']}/reject", json={"reason": "not ours"}))
        assert gone["approval"]["status"] == "rejected" and gone["deleted"] is True
        assert _error(tr.get(f"/v1/files/{junk['id']}/content"), 404)["code"] == "file_deleted"
        rejected = _ok(own.get("/v1/files", params={"approval": "rejected"}))["data"]
        assert [f["id"] for f in rejected] == [junk["id"]]
        # every decision is in the audit log, with its reason
        log = _ok(adm.get("/v1/organization/audit_logs", params={"limit": 1000}))["data"]
        decisions = [(e["action"], e["resource"], e["detail"].get("reason")) for e in log]
        assert ("file.approve", near_copy["id"], "same study, re-exported") in decisions
        assert ("file.approve", asked["id"], "IRB 7") in decisions
        assert ("file.reject", junk["id"], "not ours") in decisions
        approve = next(
            e for e in log if e["action"] == "file.approve" and e["resource"] == asked["id"]
        )
        assert approve["role"] == "data_owner" and approve["detail"]["requested_budget"] == {
            "epsilon": 50.0,
            "delta": None,
        }


def test_the_tenant_may_let_trainers_budget_their_uploads(srv):
    trainer, admin = srv.key("policy", "trainer"), srv.key("policy", "admin")
    with srv.http(trainer) as tr, srv.http(admin) as adm:
        assert _ok(tr.get("/v1/organization/policy"))["trainers_set_budgets"] is False
        body = {"trainers_set_budgets": True, "reason": "one-person lab"}
        assert _error(tr.post("/v1/organization/policy", json=body), 403)
        assert _error(adm.post("/v1/organization/policy", json={"trainers_set_budgets": True}), 400)
        assert (
            _error(adm.post("/v1/organization/policy", json={**body, "x": 1}), 422)["param"] == "x"
        )
        assert _ok(adm.post("/v1/organization/policy", json=body))["trainers_set_budgets"] is True
        f = _ok(_upload(tr, _jsonl(_rows(30, "lab")), epsilon_budget="2"))
        assert f["approval"]["status"] == "approved" and f["budget"]["epsilon"] == 2.0
        entries = _ok(adm.get("/v1/organization/audit_logs", params={"action": "policy.change"}))
        assert entries["data"][0]["detail"]["trainers_set_budgets"] == {
            "before": False,
            "after": True,
        }
        budget_set = _ok(adm.get("/v1/organization/audit_logs", params={"action": "budget.set"}))[
            "data"
        ]
        assert any(e["detail"]["file_id"] == f["id"] and e["role"] == "trainer" for e in budget_set)


def test_the_uploads_api_lands_pending_and_the_owner_approves(srv, tmp_path):
    """The official client's ``upload_file_chunked`` sends no extra fields: on a server that
    requires a budget it lands pending (it was 400 budget_required at completion)."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(_jsonl(_rows(50, "chunked")))
    client = srv.client(srv.key("chunked", "trainer"))
    done = client.uploads.upload_file_chunked(
        file=path, mime_type="text/jsonl", purpose="fine-tune", part_size=1024
    )
    assert done.status == "completed" and done.file is not None
    file_id = done.file.id
    assert client.files.retrieve(file_id).model_extra["approval"]["status"] == "pending"
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=file_id,
            extra_body={"privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}}},
        )
    owner = srv.client(srv.key("chunked", "data_owner"))
    approved = owner.post(
        f"/files/{file_id}/approve",
        body={"epsilon_budget": 2.0, "reason": "ok"},
        cast_to=object,
    )
    assert approved["approval"]["status"] == "approved"
    job = client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=file_id,
        hyperparameters={"n_epochs": 1, "batch_size": 10},
        extra_body={"privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}}},
    )
    assert job.status in ("validating_files", "queued")


def _user_rows(users: int, per_user: int, tag: str) -> list[dict]:
    return [
        {
            "text": f"{tag} entry {j} of person {u} about their sleep",
            "label": j % 2,
            "user_id": f"p{u}",
        }
        for u in range(users)
        for j in range(per_user)
    ]


def _user_job(file_id: str, epsilon: float) -> dict:
    body = exact_job_body(file_id, epsilon)
    body["privacy"]["unit"] = "user"
    return body


def test_a_person_is_one_unit_across_uploads(srv):
    """Issue 40, points 4 and 8: remapped, split or merged users cannot re-enter a per-user
    group, and a person's lines in two files that share no line are one budget group, so a
    job on each composes in one budget."""
    with srv.http(srv.key("people", "admin")) as http:
        rows = _user_rows(30, 4, "diary")
        first = _ok(_upload(http, _jsonl(rows), epsilon_budget="6"))
        assert first["budget"]["unit"] == "user" and first["n_users"] == 30
        group = first["budget_group"]
        # the same lines, one pseudo-user per line: the group would be divided among 120
        one_each = [{**r, "user_id": f"line{i}"} for i, r in enumerate(rows)]
        err = _error(_upload(http, _jsonl(one_each)), 409)
        assert err["code"] == "user_mapping_conflict" and group in err["message"]
        # each person split in two 2-line pseudo-users
        split = [{**r, "user_id": f"{r['user_id']}-{i % 4 // 2}"} for i, r in enumerate(rows)]
        assert _error(_upload(http, _jsonl(split)), 409)["code"] == "user_mapping_conflict"
        # two people merged into one, even with a new case of the text
        merged = [
            {
                **r,
                "text": r["text"].upper(),
                "user_id": "p0" if r["user_id"] == "p1" else r["user_id"],
            }
            for r in rows
        ]
        assert _error(_upload(http, _jsonl(merged)), 409)["code"] == "user_mapping_conflict"
        # the same mapping again (a subset): joins, and the group's users do not grow
        subset = _ok(_upload(http, _jsonl(rows[:60])))
        assert subset["budget_group"] == group and subset["n_users"] == 15
        # the same people with new lines (no line shared): the same data set
        later = _ok(_upload(http, _jsonl(_user_rows(30, 3, "later"))))
        assert later["budget_group"] == group and later["joined_budget_group"] is True
        # other people with new lines: a data set of their own
        others = [{**r, "user_id": f"q{r['user_id']}"} for r in _user_rows(30, 3, "other")]
        fresh = _ok(_upload(http, _jsonl(others), epsilon_budget="6"))
        assert fresh["budget_group"] != group
        # a job on each of the two files of one person's group composes in one budget
        before = _ok(http.get(f"/v1/files/{first['id']}"))["budget"]["committed"]
        _ok(http.post("/v1/fine_tuning/jobs", json=_user_job(first["id"], 2.0)))
        mid = _ok(http.get(f"/v1/files/{first['id']}"))["budget"]["committed"]
        _ok(http.post("/v1/fine_tuning/jobs", json=_user_job(later["id"], 2.0)))
        after = _ok(http.get(f"/v1/files/{first['id']}"))["budget"]["committed"]
        assert before == 0 and 0 < mid < after
        assert _ok(http.get(f"/v1/files/{fresh['id']}"))["budget"]["committed"] == 0


def test_concurrent_decisions_on_one_upload_take_turns(srv):
    """Four owners decide the same pending upload at once: one decision lands, the others are
    409 not_pending; one audit entry; no 5xx."""
    from concurrent.futures import ThreadPoolExecutor

    trainer, owner = srv.key("race", "trainer"), srv.key("race", "data_owner")
    with srv.http(trainer) as tr:
        f = _ok(_upload(tr, _jsonl(_rows(20, "race"))))

    def decide(i: int) -> int:
        with srv.http(owner) as http:
            if i % 2:
                return http.post(
                    f"/v1/files/{f['id']}/reject", json={"reason": f"r{i}"}
                ).status_code
            body = {"epsilon_budget": 1 + i, "reason": f"a{i}"}
            return http.post(f"/v1/files/{f['id']}/approve", json=body).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(decide, range(4)))
    assert codes == [200, 409, 409, 409], codes
    with srv.http(srv.key("race", "admin")) as adm:
        log = _ok(adm.get("/v1/organization/audit_logs", params={"resource": f["id"]}))["data"]
    assert len([e for e in log if e["action"] in ("file.approve", "file.reject")]) == 1


def test_typed_ids_and_a_key_collision_are_refused_over_http(srv, monkeypatch):
    """Issue 40, point 8: 7 and "7" would be one person, and so would two ids sharing a key:
    both uploads are 400 naming why, and nothing is stored."""
    from service.data import user_counts

    with srv.http(srv.key("ids", "admin")) as http:
        rows = _user_rows(5, 2, "typed")
        rows[0]["user_id"], rows[3]["user_id"] = 7, "7"
        err = _error(_upload(http, _jsonl(rows), epsilon_budget="2"), 400)
        assert err["code"] == "invalid_jsonl" and "all strings or all integers" in err["message"]
        # a 1-bit key: 5 people cannot keep 5 keys (the server runs in this process)
        real = user_counts.user_key
        monkeypatch.setattr(user_counts, "user_key", lambda user: real(user) & 1)
        err = _error(_upload(http, _jsonl(_user_rows(5, 2, "collide")), epsilon_budget="2"), 400)
        assert "user_key_collision" in err["message"]
        assert _ok(http.get("/v1/files"))["data"] == []
