"""``GET /metrics`` (issue 30, part 3) through uvicorn on SQLite and PostgreSQL, parsed with
``prometheus_client``'s own parser: requests by route template and status with a latency
histogram, jobs by status, the queue, calibration time, budget refusals and each budget group's
committed ε; behind ``DPRC_METRICS_TOKEN`` (no token: 401; unset: 404)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import Server, _serve, _settings, text_lines

TOKEN = "metrics-token-0123456789abcdef"
_TARGETS = itertools.count(1)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    tmp = tmp_path_factory.mktemp(f"dprc-metrics-{request.param}")
    yield from _serve(_settings(tmp, url, metrics_token=TOKEN))


def _samples(server: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with server.http(None) as http:
        r = http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_jobs_the_queue_and_budgets(served):
    tenant = f"metrics {served.settings.data_dir.name}"
    client = served.client(served.key(tenant))
    before = _samples(served)
    f = client.files.create(
        file=("t.jsonl", text_lines(200)), purpose="fine-tune", extra_body={"epsilon_budget": 3.0}
    )
    body = {
        "model": "dprc-tiny-llama",
        "training_file": f.id,
        "hyperparameters": {"n_epochs": 1, "batch_size": 20},
    }
    # a target no other test planned: plans are cached per process, and a cached plan runs no
    # calibration
    target = 2.5 - 0.01 * next(_TARGETS)
    job = client.fine_tuning.jobs.create(
        **body,
        extra_body={"privacy": {"target_epsilon": target, "clipping": {"method": "exact"}}},
    )
    with pytest.raises(openai.ConflictError):  # ~2.5 + 2.4 composed is beyond the budget of 3
        client.fine_tuning.jobs.create(
            **body,
            extra_body={"privacy": {"target_epsilon": 2.4, "clipping": {"method": "exact"}}},
        )
    client.files.retrieve(f.id)
    after = _samples(served)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    # requests by route template (never an id), method and status
    assert grew("dprc_http_requests_total", route="/v1/files", method="POST", status="200") == 1
    assert (
        grew("dprc_http_requests_total", route="/v1/fine_tuning/jobs", method="POST", status="409")
        == 1
    )
    assert grew("dprc_http_requests_total", route="/v1/files/{file_id}", method="GET", status="200")
    assert not any(f.id in str(labels) for (_, labels) in after)
    assert grew("dprc_http_request_duration_seconds_count", route="/v1/files", method="POST") == 1
    # jobs and the queue (no worker: the job stays queued), calibration and refusals
    assert _value(after, "dprc_jobs", status="queued") >= 1
    assert _value(after, "dprc_queue_depth") == _value(after, "dprc_jobs", status="queued")
    assert _value(after, "dprc_queue_oldest_age_seconds") >= 0
    assert grew("dprc_calibration_seconds_count") >= 1
    assert grew("dprc_budget_refusals_total") == 1
    # the budget group's committed ε is the one the API shows
    shown = client.files.retrieve(f.id).model_extra
    group = shown["budget_group"]
    committed = _value(after, "dprc_budget_epsilon_committed", tenant=tenant, budget_group=group)
    assert committed == pytest.approx(shown["budget"]["committed"])
    assert _value(after, "dprc_budget_epsilon", tenant=tenant, budget_group=group) == 3.0
    client.fine_tuning.jobs.cancel(job.id)


def test_metrics_need_the_token(served, tmp_path):
    with served.http(None) as http:
        assert http.get("/metrics").status_code == 401
        wrong = http.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_token"
    with served.http(served.key("metrics-key")) as http:  # an API key is not the token
        assert http.get("/metrics").status_code == 401
    for off in _serve(_settings(tmp_path, None)):  # no token configured: no metrics
        with off.http(None) as http:
            assert http.get("/metrics").status_code == 404


def test_the_grafana_dashboard_and_prometheus_read_what_the_api_serves(served):
    """Every series the provisioned dashboard (docker/grafana/dprc.json) queries is one the
    API's /metrics exposes (after a scrape that saw a request and a job), and Prometheus
    (docker/prometheus.yml) scrapes that path on the compose API service with the token that
    compose hands it as a secret."""
    import json
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    with served.http(None) as http:
        text = http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    exposed = {
        s.name for family in text_string_to_metric_families(text) for s in family.samples
    } | {family.name for family in text_string_to_metric_families(text)}
    dashboard = json.loads((root / "docker" / "grafana" / "dprc.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bdprc_[a-z_]+", target["expr"])
    }
    assert len(queried) >= 10
    # histogram and counter series appear once observed; their families are always declared
    families = {re.sub(r"_(bucket|total|count|sum)$", "", n) for n in queried}
    missing = {n for n in families if n not in exposed and f"{n}_total" not in exposed}
    assert not missing, missing
    prometheus = yaml.safe_load((root / "docker" / "prometheus.yml").read_text())
    (scrape,) = prometheus["scrape_configs"]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["static_configs"][0]["targets"] == ["api:8000"]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    secret = scrape["authorization"]["credentials_file"]
    assert secret == "/run/secrets/dprc_metrics_token"
    assert "dprc_metrics_token" in compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"]["dprc_metrics_token"] == {"environment": "DPRC_METRICS_TOKEN"}
    assert "DPRC_METRICS_TOKEN" in compose["x-dprc-env"]
