"""The dashboard's sketch selects (new job, accountant): their options are the API's values,
the pages stay free of inline script, and the request the new-job page sends (by cookie) is
planned with the chosen sketch."""

from __future__ import annotations

import re

import httpx

from tests.api.conftest import text_lines

SELECT = r'<select id="{}">(.*?)</select>'


def _options(page: str, select_id: str) -> list[str]:
    found = re.search(SELECT.format(re.escape(select_id)), page, re.S)
    assert found, f"no select #{select_id}"
    return re.findall(r'<option value="([^"]*)"', found.group(1))


def _enum(schema: dict, model: str) -> list[str]:
    return schema["components"]["schemas"][model]["properties"]["sketch"]["enum"]


def test_the_sketch_selects_offer_the_apis_values(sqlite_server):
    key = sqlite_server.key("sketch-pages")
    http = httpx.Client(base_url=sqlite_server.base_url, timeout=60)
    r = http.post("/sign-in", data={"api_key": key})
    assert r.status_code == 303
    schema = http.get("/openapi.json").json()
    new_job = http.get("/jobs/new")
    accountant = http.get("/accountant")
    for page in (new_job, accountant):
        assert page.status_code == 200
        assert "unsafe-inline" not in page.headers["content-security-policy"]
        assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # no inline script
    # the new job's default (first) option sends no sketch: the API's default, per example for
    # randomized methods; the accountant's default is the accountant endpoint's (shared)
    sketch_enum = next(
        alt["enum"]
        for alt in schema["components"]["schemas"]["Clipping"]["properties"]["sketch"]["anyOf"]
        if "enum" in alt
    )
    assert _options(new_job.text, "sketch") == ["", "per_example", "shared"]
    assert sorted(_options(new_job.text, "sketch")[1:]) == sorted(sketch_enum)
    assert _options(accountant.text, "acc-sketch") == ["shared", "per_example"]
    assert sorted(_options(accountant.text, "acc-sketch")) == sorted(
        _enum(schema, "EpsilonRequest")
    )

    # what new_job.js sends for the preview, by cookie as the page does
    f = sqlite_server.http(key).post(
        "/v1/files", files={"file": ("t.jsonl", text_lines(100))}, data={"purpose": "fine-tune"}
    )
    assert f.status_code == 200, f.text
    headers = {"X-DPRC-Dashboard": "1", "Origin": sqlite_server.base_url}
    body = {
        "model": "dprc-tiny-llama",
        "training_file": f.json()["id"],
        "hyperparameters": {"n_epochs": 1, "batch_size": 10},
        "privacy": {
            "target_epsilon": 3.0,
            "clipping": {"method": "hutch", "sketch": "per_example"},
        },
    }
    plan = http.post("/v1/accountant/job_plan", json=body, headers=headers)
    assert plan.status_code == 200, plan.text
    assert plan.json()["accounting_sketch"] == "per_example"
    # the default option sends no sketch: per example for hutch, nothing drawn for exact
    for method, want in (("hutch", "per_example"), ("auto", "per_example"), ("exact", "shared")):
        body["privacy"]["clipping"] = {"method": method}
        default = http.post("/v1/accountant/job_plan", json=body, headers=headers)
        assert default.status_code == 200, default.text
        assert (default.json()["sketch"], default.json()["accounting_sketch"]) == (want, want)
    body["privacy"]["clipping"] = {"method": "exact", "sketch": "per_example"}
    refused = http.post("/v1/accountant/job_plan", json=body, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "privacy.clipping.sketch"  # shown in place
