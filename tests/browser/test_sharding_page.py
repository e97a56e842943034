"""The job page says how many devices (of how many hosts) a job trains on and how its ranks hold
the model (issues 29, 46), in a real browser against a real ``dprc serve`` whose largest worker
has 2 devices (the 2-device jobs stay queued: its embedded worker has one) and which launches
jobs on 2 hosts through a Ray cluster that answers nothing (those fail at once). The words are
compared with the API's job object (the test's independent view)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from tests.browser.conftest import Dashboard
from tests.browser.test_dashboard import _sign_in


@pytest.fixture(scope="module")
def two_device_limit() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPRC_MAX_JOB_DEVICES", "2")  # read by the server the next fixture starts
        # jobs on 2 hosts through a Ray cluster that answers nothing (they fail at once)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            mp.setenv("DPRC_RAY_ADDRESS", f"127.0.0.1:{s.getsockname()[1]}")
        mp.setenv("DPRC_LAUNCHER", "ray")
        mp.setenv("DPRC_MAX_JOB_NODES", "2")
        mp.setenv("DPRC_RAY_WAIT_SECONDS", "1")
        yield


@pytest.fixture(scope="module")
def dashboard(two_device_limit, dashboard) -> Dashboard:  # the conftest's, with the limit
    return dashboard


def test_the_job_page_says_devices_and_sharding_in_words(dashboard, new_context):
    api = dashboard.api("sharon")
    lines = "".join(f'{{"text": "{"ab" * (6 + i % 5)}"}}\n' for i in range(24)).encode()
    r = api.post("/v1/files", files={"file": ("t.jsonl", lines)}, data={"purpose": "fine-tune"})
    assert r.status_code == 200, r.text
    shown = {}
    for extra, words in (
        ({"devices": 2, "sharding": "fsdp"}, "2 devices, model sharded (FSDP): 1/2 of it on each"),
        ({"devices": 2}, "2 devices, data-parallel (whole model on each)"),
        ({"nodes": 2}, "2 nodes × 1 device(s) (2 ranks), data-parallel (whole model on each)"),
        (
            {"nodes": 2, "devices": 2, "sharding": "fsdp"},
            "2 nodes × 2 device(s) (4 ranks), model sharded (FSDP): 1/4 of it on each",
        ),
        ({}, "1 device"),
    ):
        job = api.post(
            "/v1/fine_tuning/jobs",
            json={
                "model": "dprc-tiny-llama",
                "training_file": r.json()["id"],
                "hyperparameters": {"n_epochs": 1, "batch_size": 4, "max_seq_len": 32},
                "privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}},
                **extra,
            },
        )
        assert job.status_code == 200, job.text
        j = job.json()
        assert (j["devices"], j["nodes"], j["sharding"]) == (
            extra.get("devices", 1),
            extra.get("nodes", 1),
            extra.get("sharding", "none"),
        )
        shown[j["id"]] = words

    page = new_context().new_page()
    _sign_in(page, dashboard.url, dashboard.key("sharon"))
    for job_id, words in shown.items():
        page.goto(f"{dashboard.url}/jobs/{job_id}")
        page.wait_for_selector("#devices")
        assert page.locator("#devices").inner_text() == words
    dashboard.shot(page, "job_devices")


def test_the_new_job_form_sends_the_shape(dashboard, new_context):
    """Hosts and devices a host on the form become the job's nodes and devices; the plan
    preview is the one-process plan."""
    api = dashboard.api("sharon")
    lines = "".join(f'{{"text": "{"cd" * (6 + i % 5)}"}}\n' for i in range(24)).encode()
    r = api.post("/v1/files", files={"file": ("s.jsonl", lines)}, data={"purpose": "fine-tune"})
    assert r.status_code == 200, r.text
    file_id = r.json()["id"]
    page = new_context().new_page()
    _sign_in(page, dashboard.url, dashboard.key("sharon"))
    page.goto(f"{dashboard.url}/jobs/new")
    page.select_option("#training_file", file_id)
    page.select_option("#model", "dprc-tiny-llama")
    for field, value in (("#n_epochs", "1"), ("#batch_size", "4"), ("#max_seq_len", "32")):
        page.fill(field, value)
    page.select_option("#clipping", "exact")
    page.wait_for_selector("#plan[data-steps='6']")  # ⌈24 / 4⌉
    one = page.locator("#plan").get_attribute("data-noise-multiplier")
    page.fill("#nodes", "2")
    page.fill("#devices", "2")
    page.wait_for_selector("#plan[data-steps='6']")
    assert page.locator("#plan").get_attribute("data-noise-multiplier") == one
    page.click("#submit-job")
    page.wait_for_url(re.compile(r".*/jobs/ftjob-[0-9a-f]+$"))
    job = api.get(f"/v1/fine_tuning/jobs/{page.url.rsplit('/', 1)[1]}").json()
    assert (job["nodes"], job["devices"]) == (2, 2)
    page.wait_for_selector("#devices")
    words = "2 nodes × 2 device(s) (4 ranks), data-parallel (whole model on each)"
    assert page.locator("#devices").inner_text() == words


def test_the_job_page_says_the_method_and_what_a_dpo_job_protects(dashboard, new_context):
    api = dashboard.api("sharon")
    pair = (
        '{{"input": {{"messages": [{{"role": "user", "content": "say {c}"}}]}}, '
        '"preferred_output": [{{"role": "assistant", "content": "{c}{c}"}}], '
        '"non_preferred_output": [{{"role": "assistant", "content": "no"}}]}}\n'
    )
    lines = "".join(pair.format(c=c) for c in "abcdefghijkl").encode()
    r = api.post("/v1/files", files={"file": ("p.jsonl", lines)}, data={"purpose": "fine-tune"})
    assert r.status_code == 200 and r.json()["format"] == "preference", r.text
    job = api.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": "dprc-tiny-llama",
            "training_file": r.json()["id"],
            "method": {
                "type": "dpo",
                "dpo": {"hyperparameters": {"n_epochs": 1, "batch_size": 4, "beta": 0.2}},
            },
            "privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}},
            "devices": 2,  # stays queued: the embedded worker has one device
        },
    )
    assert job.status_code == 200, job.text
    assert job.json()["method"]["dpo"]["hyperparameters"]["beta"] == 0.2
    page = new_context().new_page()
    _sign_in(page, dashboard.url, dashboard.key("sharon"))
    page.goto(f"{dashboard.url}/jobs/{job.json()['id']}")
    page.wait_for_selector("#method")
    assert (
        page.locator("#method").inner_text() == "dpo (beta 0.2; one preference pair is one example)"
    )
    assert "one preference pair" in page.locator("#privacy-words").inner_text()
    assert "which one was preferred" in page.locator("#privacy-words").inner_text()
