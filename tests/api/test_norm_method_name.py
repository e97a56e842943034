"""``privacy.clipping.norm_method`` names how per-example norms are computed; ``method`` is its
deprecated name, accepted for one release: either name plans the same job, both echo in
responses, and a request giving both with different values is refused."""

from __future__ import annotations

from tests.api.conftest import text_lines

N = 200
HP = {"n_epochs": 2, "batch_size": 16}


def _body(file_id: str, clipping: dict) -> dict:
    return {
        "model": "dprc-tiny-llama",
        "training_file": file_id,
        "hyperparameters": HP,
        "privacy": {"target_epsilon": 2.0, "clipping": clipping},
    }


def test_norm_method_and_its_deprecated_name_plan_the_same_job(server):
    key = server.key("norm-method-name")
    client = server.client(key)
    f = client.files.create(file=("t.jsonl", text_lines(N)), purpose="fine-tune")
    with server.http(key) as http:
        new = http.post("/v1/fine_tuning/jobs", json=_body(f.id, {"norm_method": "hutch", "k": 8}))
        old = http.post("/v1/fine_tuning/jobs", json=_body(f.id, {"method": "hutch", "k": 8}))
        both = http.post(
            "/v1/fine_tuning/jobs",
            json=_body(f.id, {"norm_method": "hutch", "method": "hutch", "k": 8}),
        )
        preview = http.post(
            "/v1/accountant/job_plan", json=_body(f.id, {"norm_method": "hutch", "k": 8})
        )
        clash = http.post(
            "/v1/fine_tuning/jobs",
            json=_body(f.id, {"norm_method": "hutch", "method": "exact"}),
        )
        listed = http.get("/v1/fine_tuning/jobs").json()["data"]
    for r in (new, old, both, preview):
        assert r.status_code == 200, r.text
    clippings = [r.json()["privacy"]["clipping"] for r in (new, old, both)]
    assert all(c["norm_method"] == c["method"] == "hutch" for c in clippings)
    sigmas = {r.json()["privacy"]["noise_multiplier"] for r in (new, old, both)}
    assert len(sigmas) == 1
    assert preview.json()["norm_method"] == preview.json()["clipping"] == "hutch"
    assert preview.json()["noise_multiplier"] in sigmas
    assert clash.status_code == 422, clash.text
    error = clash.json()["error"]
    assert error["param"] == "privacy.clipping"
    assert "deprecated name of norm_method" in error["message"]
    assert len(listed) == 3  # the refused request created nothing
