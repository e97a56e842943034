"""Bad input: each a clear 4xx in the OpenAI error shape, and nothing written."""

from __future__ import annotations

import openai
import pytest

from dprc_core.accounting import epsilon
from tests.api.conftest import _serve, _settings, jsonl, labelled_lines


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def _stored_files(server) -> set:
    return {p.name for p in server.settings.files_dir.rglob("*") if p.is_file()}


def test_upload_errors_store_nothing(server):
    key = server.key("bad-upload")
    client = server.client(key)
    before = _stored_files(server)
    cap = server.settings.max_upload_bytes
    big = jsonl([{"text": "x" * 1000}] * (cap // 1000 + 5))
    with pytest.raises(openai.APIStatusError) as exc:
        client.files.create(file=("big.jsonl", big), purpose="fine-tune")
    assert exc.value.status_code == 413
    huge = b'{"text": "y"}\n' * ((cap + (2 << 20)) // 14)  # refused from Content-Length
    with server.http(key) as http:
        r = http.post("/v1/files", files={"file": ("h.jsonl", huge)}, data={"purpose": "fine-tune"})
        _error(r, 413)
        cases = [
            (b'{"text": "a"}\n{"text": "b"}\n{"text": oops}\n', "line 3"),
            (b'{"text": "a"}\n{"text": "b", "label": 1}\n', "line 2"),
            (b'{"text": "a"}\n["not", "an", "object"]\n', "line 2"),
            (b'{"prompt": "a", "completion": 3}\n', "line 1"),  # (strings: a format now)
            (b'{"messages": [{"role": "user", "content": "x"}]}\n', "line 1"),  # no answer
            (b'{"messages": [{"role": "wizard", "content": "x"}]}\n', "line 1"),
            (b'{"text": "a", "label": 1.5}\n{"text": "b", "label": 1}\n', "line 1"),
            (b"\n\n", "no examples"),
            (b"\xff\xfe\x00", "UTF-8"),
            (b'{"text": "only one"}\n', "at least 2"),
            # what used to pass the upload and fail (or crash) later
            (b'{"text": "a"}\n{"text": ' + b"[" * 20_000 + b"]" * 20_000 + b"}\n", "line 2"),
            (
                b'{"text": "a", "label": ' + b"7" * 5000 + b'}\n{"text": "b", "label": 1}\n',
                "line 1",
            ),
            ('{"text": "a"}\u2028{"text": "b"}\u2028{"text": "c"}\n'.encode(), "line 1"),
            (b'{"text": "a"}\n{"text": "   "}\n', "line 2"),
            (b'{"text": "a"}\n{"text": "\\ud800"}\n', "line 2"),
            (b'{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n', "2 classes"),
        ]
        for body, words in cases:
            r = http.post(
                "/v1/files", files={"file": ("b.jsonl", body)}, data={"purpose": "fine-tune"}
            )
            err = _error(r, 400)
            assert words in err["message"] and err["param"] == "file", (body, err)
        # a raw U+2028 inside a string is part of the line: accepted, as the worker reads it
        ok = '{"text": "a\u2028b"}\n{"text": "c"}\n'.encode()
        r = http.post("/v1/files", files={"file": ("u.jsonl", ok)}, data={"purpose": "fine-tune"})
        assert r.status_code == 200 and r.json()["n_examples"] == 2, r.text
        assert http.delete(f"/v1/files/{r.json()['id']}").status_code == 200
        r = http.post(
            "/v1/files",
            files={"file": ("b.jsonl", labelled_lines(5))},
            data={"purpose": "assistants"},
        )
        assert _error(r, 400)["param"] == "purpose"
        for form in (
            {"epsilon_budget": "-1"},
            {"epsilon_budget": "nan"},
            {"epsilon_budget": "1e9"},
            {"delta": "2"},
        ):
            r = http.post(
                "/v1/files",
                files={"file": ("b.jsonl", labelled_lines(5))},
                data={"purpose": "fine-tune", **form},
            )
            assert r.status_code in (400, 422), (form, r.text)
        r = http.post(
            "/v1/files",
            files={"file": ("b.jsonl", labelled_lines(10))},
            data={"purpose": "fine-tune", "epsilon_budget": "1", "delta": "0.5"},
        )
        assert _error(r, 400)["code"] == "invalid_delta"  # δ above 1/N
    assert client.files.list().data == []
    assert _stored_files(server) == before


BAD_JOBS = [
    # (patch, status, param)
    ({"model": "no-such-model"}, 404, "model"),
    ({"model": "../../etc/passwd"}, 400, "model"),
    ({"model": "/models/minilm"}, 400, "model"),
    ({"model": "org/minilm-l6-v2"}, 400, "model"),
    ({"privacy": {"target_epsilon": -1}}, 422, "privacy.target_epsilon"),
    # wrong JSON types are 422, never coerced: true is not a batch size, "16" not a number
    ({"hyperparameters": {"batch_size": True}}, 422, "hyperparameters.batch_size"),
    ({"hyperparameters": {"batch_size": "16"}}, 422, "hyperparameters.batch_size"),
    ({"hyperparameters": {"n_epochs": 1.0}}, 422, "hyperparameters.n_epochs"),
    ({"privacy": {"target_epsilon": "1"}}, 422, "privacy.target_epsilon"),
    ({"privacy": {"target_epsilon": 0}}, 422, "privacy.target_epsilon"),
    ({"privacy": {"target_epsilon": 1e6}}, 422, "privacy.target_epsilon"),
    ({"privacy": {"target_epsilon": 1, "target_delta": -1e-5}}, 422, "privacy.target_delta"),
    ({"privacy": {"target_epsilon": 1, "target_delta": 0.5}}, 400, "privacy.target_delta"),
    (
        {"privacy": {"target_epsilon": 1, "clipping": {"method": "hutch", "k": 0}}},
        422,
        "privacy.clipping.k",
    ),
    (
        {"privacy": {"target_epsilon": 1, "clipping": {"method": "hutch", "k": 1}}},
        400,
        "privacy.clipping.k",
    ),
    (
        {"privacy": {"target_epsilon": 1, "clipping": {"method": "exact", "k": 8}}},
        400,
        "privacy.clipping.k",
    ),
    (
        {"privacy": {"target_epsilon": 1, "clipping": {"method": "ghost"}}},
        422,
        "privacy.clipping.method",
    ),
    (
        {"privacy": {"target_epsilon": 1, "noise": {"mechanism": "laplace"}}},
        422,
        "privacy.noise.mechanism",
    ),
    (
        {"privacy": {"target_epsilon": 1, "clipping": {"norm_method": "ghost"}}},
        422,
        "privacy.clipping.norm_method",
    ),
    (
        {"privacy": {"target_epsilon": 1, "clipping": {"norm_method": "hutch", "method": "exact"}}},
        422,
        "privacy.clipping",
    ),
    ({"privacy": {"target_epsilon": 1, "max_grad_norm": -2}}, 422, "privacy.max_grad_norm"),
    ({"privacy": {"target_epsilon": 1, "sigma": 3}}, 422, "privacy.sigma"),
    ({"hyperparameters": {"batch_size": 0}}, 422, "hyperparameters.batch_size"),
    ({"hyperparameters": {"batch_size": 10**9}}, 422, "hyperparameters.batch_size"),
    ({"hyperparameters": {"batch_size": 500}}, 400, "hyperparameters.batch_size"),
    ({"hyperparameters": {"n_epochs": 0}}, 422, "hyperparameters.n_epochs"),
    ({"hyperparameters": {"n_epochs": 1000, "batch_size": 1}}, 400, "hyperparameters.n_epochs"),
    ({"hyperparameters": {"warmup": 3}}, 422, "hyperparameters.warmup"),
    ({"unknown_field": 1}, 422, "unknown_field"),
    ({"validation_file": "file-x"}, 404, "validation_file"),
    ({"suffix": "../x"}, 422, "suffix"),
    ({"training_file": "file-missing"}, 404, "training_file"),
    ({"privacy": None}, 422, "privacy"),
]


def test_bad_job_requests_write_nothing(server):
    key = server.key("bad-jobs")
    client = server.client(key)
    f = client.files.create(
        file=("d.jsonl", labelled_lines(400)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "4"},
    )
    good = {
        "model": "minilm-l6-v2",
        "training_file": f.id,
        "hyperparameters": {"n_epochs": 1, "batch_size": 20},
        "privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}},
    }
    with server.http(key) as http:
        for patch, status, param in BAD_JOBS:
            body = {**good, **patch}
            if "hyperparameters" in patch:
                body["hyperparameters"] = {**good["hyperparameters"], **patch["hyperparameters"]}
            r = http.post("/v1/fine_tuning/jobs", json=body)
            err = _error(r, status)
            assert err["param"] == param, (patch, err)
        r = http.post(
            "/v1/fine_tuning/jobs",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        _error(r, 422)
    assert client.fine_tuning.jobs.list().data == []
    assert client.files.retrieve(f.id).model_extra["budget"]["committed"] == 0.0
    # the SDK raises its typed exceptions
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.create(
            model="nope", training_file=f.id, extra_body={"privacy": {"target_epsilon": 1}}
        )
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.create(
            model="a/b", training_file=f.id, extra_body={"privacy": {"target_epsilon": 1}}
        )
    with pytest.raises(openai.UnprocessableEntityError):
        client.fine_tuning.jobs.create(
            model="minilm-l6-v2", training_file=f.id, extra_body={"privacy": {"target_epsilon": -1}}
        )
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-nope")


def test_accountant(server):
    key = server.key("acct")
    with server.http(key) as http:
        r = http.post(
            "/v1/accountant/noise_multiplier",
            json={
                "target_epsilon": 2.0,
                "target_delta": 1e-5,
                "sample_rate": 0.01,
                "steps": 300,
                "clipping": "hutch",
                "k": 16,
            },
        )
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["clipping"] == "hutch" and out["k"] == 16 and out["rank"] is None
        assert out["delta"] == 1e-5
        sigma = out["noise_multiplier"]
        assert epsilon(sigma, 0.01, 300, 1e-5, "hutch", 16) <= 2.0
        assert epsilon(sigma / 1.005, 0.01, 300, 1e-5, "hutch", 16) > 2.0
        r = http.post(
            "/v1/accountant/epsilon",
            json={
                "noise_multiplier": sigma,
                "delta": 1e-5,
                "sample_rate": 0.01,
                "steps": 300,
                "clipping": "hutch",
                "k": 16,
            },
        )
        assert r.status_code == 200
        assert r.json()["epsilon"] == epsilon(sigma, 0.01, 300, 1e-5, "hutch", 16)
        assert r.json()["accountant"]["settings"]["tail_fraction"] > 0
        base = {"noise_multiplier": 1.0, "delta": 1e-5, "sample_rate": 0.01, "steps": 10}
        for patch, param in [
            ({"noise_multiplier": -1.0}, "noise_multiplier"),
            ({"noise_multiplier": 0}, "noise_multiplier"),
            ({"delta": 1.5}, "delta"),
            ({"sample_rate": 2}, "sample_rate"),
            ({"steps": 0}, "steps"),
            ({"steps": 10**9}, "steps"),
            ({"clipping": "magic"}, "clipping"),
            ({"clipping": "hutch"}, "k"),
            ({"clipping": "hutch", "k": 1}, "k"),
            ({"clipping": "hutch", "k": 0}, "k"),
            ({"clipping": "exact", "k": 4}, "k"),
            ({"clipping": "hutch", "k": 4, "rank": 0}, "rank"),
        ]:
            err = _error(http.post("/v1/accountant/epsilon", json={**base, **patch}), 400)
            assert err["param"] == param, (patch, err)
        err = _error(
            http.post(
                "/v1/accountant/epsilon",
                json={
                    "noise_multiplier": 0.001,
                    "delta": 1e-5,
                    "sample_rate": 0.5,
                    "steps": 1000000,
                },
            ),
            400,
        )
        assert err["code"] == "accounting_failed"  # too extreme for the accountant's grid
        err = _error(http.post("/v1/accountant/epsilon", json={**base, "steps": "ten"}), 422)
        assert err["param"] == "steps"
        err = _error(http.post("/v1/accountant/epsilon", json={**base, "extra": 1}), 422)
        err = _error(
            http.post(
                "/v1/accountant/noise_multiplier",
                json={"target_epsilon": -2, "target_delta": 1e-5, "sample_rate": 0.01, "steps": 3},
            ),
            400,
        )
        assert err["param"] == "target_epsilon"


def test_active_job_limit_is_429(tmp_path):
    settings = _settings(tmp_path, None).model_copy(update={"max_active_jobs_per_tenant": 2})
    for srv in _serve(settings):
        client = srv.client(srv.key("limited"))
        f = client.files.create(file=("d.jsonl", labelled_lines(50)), purpose="fine-tune")
        kwargs = {
            "model": "minilm-l6-v2",
            "training_file": f.id,
            "extra_body": {"privacy": {"target_epsilon": 5.0, "clipping": {"method": "exact"}}},
        }
        jobs = [client.fine_tuning.jobs.create(**kwargs) for _ in range(2)]
        with pytest.raises(openai.RateLimitError) as exc:
            client.fine_tuning.jobs.create(**kwargs)
        assert exc.value.response.headers["x-should-retry"] == "false"
        client.fine_tuning.jobs.cancel(jobs[0].id)
        assert client.fine_tuning.jobs.create(**kwargs).status == "queued"
        # another tenant is not limited by the first one's jobs
        other = srv.client(srv.key("other"))
        f2 = other.files.create(file=("d.jsonl", labelled_lines(50)), purpose="fine-tune")
        assert other.fine_tuning.jobs.create(**{**kwargs, "training_file": f2.id}).id


def test_delete_file_in_use_is_409(server):
    client = server.client(server.key("in-use"))
    f = client.files.create(file=("d.jsonl", labelled_lines(50)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=f.id,
        extra_body={"privacy": {"target_epsilon": 5.0, "clipping": {"method": "exact"}}},
    )
    with pytest.raises(openai.ConflictError):
        client.files.delete(f.id)
    client.fine_tuning.jobs.cancel(job.id)
    assert client.files.delete(f.id).deleted


def test_budget_endpoint(server):
    key = server.key("budget-endpoint")
    client = server.client(key)
    f = client.files.create(file=("d.jsonl", labelled_lines(100)), purpose="fine-tune")
    assert f.model_extra["budget"] is None
    out = client.post(
        f"/files/{f.id}/budget", body={"epsilon_budget": 3.0, "reason": "set"}, cast_to=object
    )
    assert out["budget"]["epsilon"] == 3.0 and out["budget"]["delta"] <= 100**-1.1
    client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 10},
        extra_body={"privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}}},
    )
    with pytest.raises(openai.ConflictError):  # lowering below what is committed
        client.post(
            f"/files/{f.id}/budget", body={"epsilon_budget": 1.0, "reason": "r"}, cast_to=object
        )
    with pytest.raises(openai.BadRequestError):  # a 400 naming the field (docs/governance.md)
        client.post(
            f"/files/{f.id}/budget", body={"epsilon_budget": -1.0, "reason": "r"}, cast_to=object
        )


def test_healthz(server, tmp_path):
    with server.http(None) as http:
        r = http.get("/healthz")
        assert r.status_code == 200 and r.json()["checks"]["store"] == "ok"
        assert http.get("/openapi.json").status_code == 200
        assert http.get("/docs").status_code == 200
    settings = _settings(tmp_path, None).model_copy(
        update={"broker_url": "redis://127.0.0.1:6379/0"}
    )
    for srv in _serve(settings):
        with srv.http(None) as http:
            assert http.get("/healthz").json()["checks"]["broker"] == "ok"
    settings = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    for srv in _serve(settings):
        with srv.http(None) as http:
            r = http.get("/healthz")
            assert r.status_code == 503 and r.json()["checks"]["broker"].startswith("error")


def test_nul_characters_are_4xx(server):
    """PostgreSQL text cannot hold NUL: such values are refused before the store sees them."""
    key = server.key("nul")
    with server.http(key) as http:
        assert _error(http.get("/v1/files", params={"after": "a\x00b"}), 400)
        assert _error(http.get("/v1/fine_tuning/jobs/ftjob-x%00/events"), 400)
        r = http.post(
            "/v1/fine_tuning/jobs",
            json={
                "model": "minilm-l6-v2",
                "training_file": "\x00x",
                "privacy": {"target_epsilon": 1.0},
            },
        )
        assert _error(r, 422)["param"] == "training_file"


def test_accountant_nu_dpftrl(server):
    from dprc_core.accounting import dpftrl_epsilon, dpftrl_sensitivity

    key = server.key("acct-ftrl")
    base = {
        "mechanism": "nu-dpftrl",
        "nu": 0.1,
        "bands": 8,
        "steps": 40,
        "participations": 4,
        "min_separation": 10,
    }
    with server.http(key) as http:
        r = http.post(
            "/v1/accountant/epsilon", json={**base, "noise_multiplier": 2.0, "delta": 1e-5}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        pattern = {k: base[k] for k in ("nu", "steps", "participations", "min_separation", "bands")}
        assert body["epsilon"] == dpftrl_epsilon(2.0, 1e-5, **pattern)
        assert body["sensitivity"] == dpftrl_sensitivity(**pattern)
        assert body["sample_rate"] is None and body["mechanism"] == "nu_dpftrl"
        r = http.post(
            "/v1/accountant/noise_multiplier",
            json={**base, "target_epsilon": 3.0, "target_delta": 1e-5},
        )
        assert r.status_code == 200, r.text
        sigma = r.json()["noise_multiplier"]
        assert dpftrl_epsilon(sigma, 1e-5, **pattern) <= 3.0
        for patch, param in (
            ({"sample_rate": 0.1}, "sample_rate"),
            ({"clipping": "hutch", "k": 8}, "clipping"),
            ({"nu": None}, "nu"),
            ({"nu": 1.5}, "nu"),
        ):
            err = _error(
                http.post(
                    "/v1/accountant/epsilon",
                    json={**base, "noise_multiplier": 2.0, "delta": 1e-5, **patch},
                ),
                400,
            )
            assert err["param"] == param, err


def test_oversized_bodies_are_413_before_authentication(server):
    """A JSON body over max_request_bytes is refused before anything reads it — with no key,
    with a wrong key, from its Content-Length or, chunked, once the limit is passed; a body
    within the limit still gets the ordinary 401."""
    import httpx

    limit = server.settings.max_request_bytes
    big = b'{"model": "' + b"x" * (limit + 10) + b'"}'
    url = f"{server.base_url}/v1/fine_tuning/jobs"

    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    with httpx.Client(timeout=60) as http:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            r = http.post(url, content=big, headers={**headers, "Content-Type": "application/json"})
            assert r.status_code == 413, r.text
            assert _error(r, 413)["code"] == "request_too_large"
            r = http.post(
                url, content=chunks(), headers={**headers, "Content-Type": "application/json"}
            )
            assert r.status_code == 413, r.text  # no Content-Length: counted as it arrives
        r = http.post(url, content=b'{"model": "m"}', headers={"Content-Type": "application/json"})
        assert r.status_code == 401
