"""The job page's ε chart in a real browser against a real ``dprc serve``: for a job that runs as
planned, each plotted ε is the accountant's ε for that many steps of the job's plan (asked here
independently through ``POST /v1/accountant/epsilon``), the line never dips below it, and the ε
spent the job reports is drawn at its last step; a paused job, then the same job cancelled,
shows where it left the plan as vertical markers at the steps its events give."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import Watch, _lines, _sign_in

pytestmark = pytest.mark.slow  # a job runs to its end, a second is paused, resumed, cancelled


def _accountant_epsilon(api: httpx.Client, privacy: dict[str, Any], steps: int) -> float:
    """ε after ``steps`` steps of the job's plan: its σ, q, δ and what the accountant charges
    (clipping/envelope, k, sketch), as the job object echoes them."""
    acc = privacy["accountant"]
    answer = api.post(
        "/v1/accountant/epsilon",
        json={
            "noise_multiplier": privacy["noise_multiplier"],
            "sample_rate": privacy["sample_rate"],
            "steps": steps,
            "delta": privacy["target_delta"],
            "clipping": acc["clipping"],
            "k": acc["k"],
            "sketch": acc["sketch"],
        },
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["epsilon"]


def _wait(api: httpx.Client, job_id: str, done, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = api.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        if done(job):
            return job
        assert time.monotonic() < deadline, f"{job_id}: {job['status']}, {job['steps_done']}"
        time.sleep(0.1)


def _job(api: httpx.Client, n_epochs: int, clipping: dict[str, Any], **extra) -> dict[str, Any]:
    f = api.post(
        "/v1/files",
        files={"file": ("t.jsonl", _lines(48, " chart").encode())},
        data={"purpose": "fine-tune"},
    ).json()
    job = api.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": "dprc-tiny-llama",
            "training_file": f["id"],
            "hyperparameters": {"n_epochs": n_epochs, "batch_size": 8, "max_seq_len": 32},
            "privacy": {"target_epsilon": 8.0, "clipping": clipping},
            **extra,
        },
    )
    assert job.status_code == 200, job.text
    return job.json()


def _plotted(page, series: str) -> list[tuple[float, float]]:
    return [
        (float(x), float(y))
        for x, y in page.eval_on_selector_all(
            f"#chart-epsilon g.series[data-series='{series}'] circle",
            "cs => cs.map((c) => [c.dataset.x, c.dataset.y])",
        )
    ]


def _markers(page) -> list[tuple[str, int]]:
    return [
        (key, int(x))
        for key, x in page.eval_on_selector_all(
            "#chart-epsilon g.marker", "gs => gs.map((g) => [g.dataset.marker, g.dataset.x])"
        )
    ]


def _settled(page, status: str) -> None:
    page.wait_for_selector(f"main[data-status='{status}']", timeout=120_000)
    page.wait_for_selector("#chart-epsilon[data-complete='true']", timeout=120_000)


def _check_curve(api, page, job: dict[str, Any]) -> list[tuple[float, float]]:
    """Every plotted ε of the steps that ran is the accountant's for that many steps; the last
    is at the job's last step; the job's own ε spent is drawn there, not below it."""
    plotted = _plotted(page, "actual")
    assert plotted and all(0 < x <= job["steps_done"] for x, _ in plotted)
    assert plotted[-1][0] == job["steps_done"]
    for x, y in plotted:
        assert x == int(x)
        assert y == pytest.approx(_accountant_epsilon(api, job["privacy"], int(x)), rel=1e-12), x
    assert [y for _, y in plotted] == sorted(y for _, y in plotted)  # never decreasing
    spent = _plotted(page, "spent")
    exact_end = plotted[-1][1]
    assert len(spent) == 1 and spent[0][0] == job["steps_done"]
    assert spent[0][1] == max(job["privacy"]["epsilon_spent"], exact_end)
    assert job["privacy"]["epsilon_spent"] >= exact_end * (1 - 1e-12)
    return plotted


def test_a_job_run_as_planned_plots_the_accountants_epsilon_at_each_step(dashboard, new_context):
    api = dashboard.api("carol")
    job = _job(api, 2, {"method": "hutch", "k": 16}, checkpoint_every=4)  # ⌈2 · 48 / 8⌉ = 12
    assert job["steps_total"] == 12
    job = _wait(api, job["id"], lambda j: j["status"] in ("succeeded", "failed", "cancelled"))
    assert job["status"] == "succeeded", job["error"]
    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, dashboard.key("carol"))
    page.goto(f"{dashboard.url}/jobs/{job['id']}")
    _settled(page, "succeeded")
    plotted = _check_curve(api, page, job)
    assert [int(x) for x, _ in plotted] == list(range(1, 13))  # every step of a short plan
    assert _markers(page) == []  # it ran as planned
    # the checkpoints' exact ε (the worker's ledger) lie on the plan's curve
    ckpts = api.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints").json()["data"]
    curve = dict(plotted)
    assert sorted(c["step_number"] for c in ckpts) == [4, 8, 12]
    for c in ckpts:
        assert c["epsilon"] == pytest.approx(curve[c["step_number"]], rel=1e-9)
    # the plan to its last step: the same curve (no dots)
    assert int(
        page.locator("#chart-epsilon g[data-series='planned']").get_attribute("data-points")
    ) == len(plotted)
    dashboard.shot(page, "job_epsilon_chart", full_page=True)
    assert watch.errors == []


def test_a_paused_then_cancelled_job_marks_where_it_left_the_plan(dashboard, new_context):
    api = dashboard.api("carol")
    job = _job(api, 100, {"method": "exact"})  # 600 steps: paused and cancelled long before
    steps_total = job["steps_total"]
    _wait(api, job["id"], lambda j: j["steps_done"] >= 3)
    assert api.post(f"/v1/fine_tuning/jobs/{job['id']}/pause").status_code == 200
    job = _wait(api, job["id"], lambda j: j["status"] == "paused", timeout=120)
    paused_at = job["steps_done"]
    assert 0 < paused_at < steps_total

    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, dashboard.key("carol"))
    page.goto(f"{dashboard.url}/jobs/{job['id']}")
    _settled(page, "paused")
    _check_curve(api, page, job)
    assert _markers(page) == [("paused", paused_at)]
    assert f"paused at step {paused_at}" in page.locator("#chart-epsilon g.marker").text_content()
    dashboard.shot(page, "job_paused")

    assert api.post(f"/v1/fine_tuning/jobs/{job['id']}/resume").status_code == 200
    _wait(api, job["id"], lambda j: j["status"] == "running" and j["steps_done"] > paused_at + 2)
    assert api.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel").status_code == 200
    job = _wait(api, job["id"], lambda j: j["status"] == "cancelled", timeout=120)
    cancelled_at = job["steps_done"]
    assert paused_at < cancelled_at < steps_total
    _settled(page, "cancelled")  # the same page, still polling
    plotted = _check_curve(api, page, job)
    assert any(x == paused_at for x, _ in plotted)  # exact at the departure
    assert _markers(page) == [("paused", paused_at), ("cancelled", cancelled_at)]
    dashboard.shot(page, "job_cancelled", full_page=True)
    assert watch.errors == []
