"""The JSON endpoints the dashboard added and its session cookie, over uvicorn (SQLite).

* ``GET /v1/files/{id}/budget/history``: the composed ε after each job, checked against
  dp_accounting's PLD accountant called here on the jobs' (σ, q, steps);
* ``POST /v1/accountant/job_plan``: the plan job creation then makes, and the budget it leaves;
* the sign-in cookie: HttpOnly, SameSite=Strict, not the key; CSRF refusals; revocation;
  forged cookies; another tenant's pages are 404; the CSP header;
* the pages by role: the role next to the tenant, the admin pages (keys, audit log) in the
  menu and open to admins only (a 403 page for the others), the budget change on a data set's
  page for admins only, with a required reason.

The sessions themselves (sign-out, expiry, malformed cookies, the Secure flag):
tests/api/test_dashboard_sessions.py.
"""

from __future__ import annotations

import re

import dp_accounting
import pytest

from api.dashboard.session import COOKIE
from service.governance.keys import revoke_key
from tests.api.conftest import labelled_lines


def _pld_epsilon(jobs: list[tuple[float, float, int]], delta: float) -> float:
    """dp_accounting's PLD ε for Poisson-subsampled Gaussian jobs (σ, q, steps) composed."""
    acc = dp_accounting.pld.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4,
    )
    for sigma, q, steps in jobs:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        acc.compose(event, steps)
    return acc.get_epsilon(delta)


def _job(http, file_id: str, eps: float, batch: int = 10) -> dict:
    body = {
        "model": "minilm-l6-v2",
        "training_file": file_id,
        "hyperparameters": {"n_epochs": 1, "batch_size": batch},
        "privacy": {"target_epsilon": eps, "clipping": {"method": "exact"}},
    }
    r = http.post("/v1/fine_tuning/jobs", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _upload(http, n: int = 100, budget: str | None = "10", delta: str | None = "0.001") -> dict:
    data = {"purpose": "fine-tune"}
    if budget:
        data["epsilon_budget"] = budget
    if delta:
        data["delta"] = delta
    r = http.post("/v1/files", files={"file": ("t.jsonl", labelled_lines(n))}, data=data)
    assert r.status_code == 200, r.text
    return r.json()


def test_budget_history_composes_the_jobs_in_order(sqlite_server):
    http = sqlite_server.http(sqlite_server.key("history"))
    f = _upload(http)
    first, second = _job(http, f["id"], 1.0), _job(http, f["id"], 2.0)
    r = http.get(f"/v1/files/{f['id']}/budget/history")
    assert r.status_code == 200, r.text
    hist = r.json()
    assert hist["delta"] == 0.001 and hist["epsilon_budget"] == 10.0
    assert [p["job_id"] for p in hist["data"]] == [first["id"], second["id"]]
    plans = [
        (j["privacy"]["noise_multiplier"], j["privacy"]["sample_rate"], j["privacy"]["steps"])
        for j in (first, second)
    ]
    # nothing ran: spent is 0; committed composes the reservations, job by job
    assert all(p["spent"] == 0.0 and p["job_epsilon_spent"] == 0.0 for p in hist["data"])
    for point, upto in zip(hist["data"], (plans[:1], plans), strict=True):
        want = _pld_epsilon(upto, 0.001)
        assert want * (1 - 1e-3) <= point["committed"] <= want * 1.02, (point, want)
    # the last point is the file's committed budget
    budget = http.get(f"/v1/files/{f['id']}").json()["budget"]
    assert hist["data"][-1]["committed"] == pytest.approx(budget["committed"], rel=1e-9)
    # cancelling the first releases its reservation in the history too
    http.post(f"/v1/fine_tuning/jobs/{first['id']}/cancel")
    hist = http.get(f"/v1/files/{f['id']}/budget/history").json()
    assert hist["data"][0]["committed"] == 0.0
    want = _pld_epsilon(plans[1:], 0.001)
    assert want * (1 - 1e-3) <= hist["data"][1]["committed"] <= want * 1.02
    other = sqlite_server.http(sqlite_server.key("history-other"))
    assert other.get(f"/v1/files/{f['id']}/budget/history").status_code == 404


def test_job_plan_is_what_creation_plans(sqlite_server):
    http = sqlite_server.http(sqlite_server.key("plan"))
    f = _upload(http, budget="4")
    body = {
        "model": "minilm-l6-v2",
        "training_file": f["id"],
        "hyperparameters": {"n_epochs": 2, "batch_size": 20},
        "privacy": {
            "target_epsilon": 3.0,
            "target_delta": 0.001,  # the file's δ: the budget then composes ε ≈ 3
            "clipping": {"method": "hutch", "k": 16},
        },
    }
    r = http.post("/v1/accountant/job_plan", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["sample_rate"] == 20 / 100 and plan["steps"] == 10  # ⌈2·100/20⌉
    assert plan["target_delta"] == 0.001
    # the accountant endpoint, asked for the same plan, calibrates the same σ
    calib = http.post(
        "/v1/accountant/noise_multiplier",
        json={
            "target_epsilon": 3.0,
            "target_delta": plan["target_delta"],
            "sample_rate": plan["sample_rate"],
            "steps": plan["steps"],
            "clipping": "hutch",
            "k": 16,
            "sketch": plan["accounting_sketch"],  # per_example: the default for hutch
        },
    ).json()
    assert plan["accounting_sketch"] == "per_example"
    assert plan["noise_multiplier"] == pytest.approx(calib["noise_multiplier"], rel=1e-12)
    assert plan["planned_epsilon"] == pytest.approx(calib["epsilon"], rel=1e-12)
    assert plan["budget"]["committed"] == 0.0 and plan["budget"]["fits"] is True
    assert plan["budget"]["committed_with_job"] == pytest.approx(plan["planned_epsilon"], rel=1e-6)
    job = http.post("/v1/fine_tuning/jobs", json=body).json()
    for name in ("noise_multiplier", "sample_rate", "steps", "planned_epsilon", "target_delta"):
        assert job["privacy"][name] == plan[name], name
    after = http.get(f"/v1/files/{f['id']}").json()["budget"]
    assert after["committed"] == pytest.approx(plan["budget"]["committed_with_job"], rel=1e-9)
    # a second such job would exceed ε = 4: the preview says so, and creation refuses it
    again = http.post("/v1/accountant/job_plan", json=body).json()["budget"]
    assert again["fits"] is False and again["remaining_after"] < 0
    assert http.post("/v1/fine_tuning/jobs", json=body).status_code == 409
    # bad values are the API's 400 naming the parameter; another tenant's file is 404
    bad = {**body, "hyperparameters": {"n_epochs": 1, "batch_size": 1000}}
    r = http.post("/v1/accountant/job_plan", json=bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "hyperparameters.batch_size"
    other = sqlite_server.http(sqlite_server.key("plan-other"))
    assert other.post("/v1/accountant/job_plan", json=body).status_code == 404


def _sign_in(sqlite_server, key: str):
    import httpx

    http = httpx.Client(base_url=sqlite_server.base_url, timeout=60)
    r = http.post("/sign-in", data={"api_key": key})
    assert r.status_code == 303 and r.headers["location"] == "/"
    return http, r


def test_sign_in_sets_a_session_cookie_not_the_key(sqlite_server):
    key = sqlite_server.key("cookie")
    http, r = _sign_in(sqlite_server, key)
    header = r.headers["set-cookie"]
    assert header.startswith(f"{COOKIE}=")
    assert "HttpOnly" in header and "SameSite=strict" in header and "Path=/" in header
    assert key not in header and key.split("-", 1)[1] not in header
    assert not (sqlite_server.settings.data_dir / "dashboard.secret").exists()  # no longer
    me = http.get("/v1/me")
    assert me.status_code == 200 and me.json()["tenant"] == "cookie"
    page = http.get("/")
    assert page.status_code == 200 and key not in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # no inline script
    # a change by cookie needs the dashboard header and the same origin
    f = _upload(sqlite_server.http(key))
    url = f"/v1/files/{f['id']}"
    refused = http.delete(url)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "csrf_check_failed"
    cross = http.delete(url, headers={"X-DPRC-Dashboard": "1", "Origin": "https://evil.example"})
    assert cross.status_code == 401
    assert sqlite_server.http(key).get(url).status_code == 200  # still there
    ok = http.delete(url, headers={"X-DPRC-Dashboard": "1", "Origin": sqlite_server.base_url})
    assert ok.status_code == 200 and ok.json()["deleted"] is True
    # a changed token is refused; a revoked key ends its sessions
    value = http.cookies[COOKIE]
    forged = value[:-1] + ("A" if value[-1] != "A" else "B")
    import httpx

    bad = httpx.get(f"{sqlite_server.base_url}/v1/me", cookies={COOKIE: forged})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_session"
    assert httpx.get(f"{sqlite_server.base_url}/", cookies={COOKIE: forged}).status_code == 303
    with sqlite_server.store.sessions() as session:
        key_id = http.get("/v1/me").json()["key_id"]
        assert revoke_key(session, key_id)
    assert http.get("/v1/me").status_code == 401
    page = http.get("/jobs")
    assert page.status_code == 303 and page.headers["location"] == "/sign-in"


def test_bad_key_and_other_tenants_pages(sqlite_server):
    import httpx

    anon = httpx.Client(base_url=sqlite_server.base_url, timeout=60)
    r = anon.post("/sign-in", data={"api_key": "dprc-not-a-key"})
    assert (
        r.status_code == 401
        and "incorrect API key" in r.text
        and COOKIE not in r.headers.get("set-cookie", "")
    )
    r = anon.post("/sign-in", data={"api_key": "x"}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    assert anon.get("/jobs").status_code == 303  # not signed in: to the sign-in page
    owner = sqlite_server.http(sqlite_server.key("owner"))
    f = _upload(owner)
    job = _job(owner, f["id"], 2.0)
    stranger, _ = _sign_in(sqlite_server, sqlite_server.key("stranger"))
    for path in (f"/jobs/{job['id']}", f"/data-sets/{f['id']}"):
        page = stranger.get(path)
        assert page.status_code == 404 and "Not found" in page.text, path
        assert page.headers["content-security-policy"]
    mine, _ = _sign_in(sqlite_server, sqlite_server.key("owner"))
    assert mine.get(f"/jobs/{job['id']}").status_code == 200
    assert mine.get(f"/data-sets/{f['id']}").status_code == 200
    static = mine.get("/dashboard/static/chart.js")
    assert static.status_code == 200 and static.headers["content-security-policy"]


def test_pages_by_role(sqlite_server):
    """Admins see and open the keys and audit pages; a trainer or viewer gets a 403 page."""
    admin, _ = _sign_in(sqlite_server, sqlite_server.key("roles", "admin"))
    home = admin.get("/")
    assert home.status_code == 200 and 'data-role="admin"' in home.text
    assert '<span class="role" id="role"' in home.text and ">admin</span>" in home.text
    assert 'href="/keys"' in home.text and 'href="/audit"' in home.text
    for path, script in (("/keys", "keys.js"), ("/audit", "audit.js")):
        page = admin.get(path)
        assert page.status_code == 200 and f"/dashboard/static/{script}" in page.text, path
        assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # no inline script
        assert "default-src 'none'" in page.headers["content-security-policy"]
    audit = admin.get("/audit").text
    assert '<option value="session.sign_in">' in audit and '<option value="key.create">' in audit
    for role in ("trainer", "viewer"):
        http, _ = _sign_in(sqlite_server, sqlite_server.key("roles", role))
        home = http.get("/")
        assert f'data-role="{role}"' in home.text and f">{role}</span>" in home.text
        assert 'href="/keys"' not in home.text and 'href="/audit"' not in home.text
        for path in ("/keys", "/audit"):
            page = http.get(path)
            assert page.status_code == 403 and "Not allowed" in page.text, (role, path)
            assert f"the {role} key" in page.text and ".js" not in page.text.split("<main")[1]
            assert page.headers["content-security-policy"]
    # not signed in: the sign-in page
    import httpx

    anon = httpx.Client(base_url=sqlite_server.base_url, timeout=60)
    assert anon.get("/keys").headers["location"] == "/sign-in"


def test_the_budget_change_is_for_admins_only(sqlite_server):
    """The data set's page has the budget form, with a required reason, for admins; the others
    see the budget read-only."""
    f = _upload(sqlite_server.http(sqlite_server.key("budget-form")))
    admin, _ = _sign_in(sqlite_server, sqlite_server.key("budget-form", "admin"))
    page = admin.get(f"/data-sets/{f['id']}").text
    assert 'id="budget-form"' in page and 'id="budget-read-only"' not in page
    assert re.search(r'<input[^>]*name="reason"[^>]*id="budget-reason"[^>]*required', page)
    for role in ("trainer", "viewer"):
        http, _ = _sign_in(sqlite_server, sqlite_server.key("budget-form", role))
        page = http.get(f"/data-sets/{f['id']}").text
        assert 'id="budget-form"' not in page and 'id="budget-read-only"' in page, role
