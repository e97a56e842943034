"""The dashboard in a real browser (Debian's Chromium, headless, through Playwright) against a
real ``dprc serve``: sign-in (a bad key is an error, not a blank page), an upload with a budget,
a job created from the form after its σ/ε preview is checked against the accountant endpoint,
followed to ``succeeded`` without a reload, its charts against its progress events, a
checkpoint and the ledger downloaded and compared with the API's, a second job cancelled, and
another tenant's pages: 404. Screenshots of every page go to the test's output folder (and to
``$DPRC_DASHBOARD_SHOTS``, see docs/dashboard.md)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from tests.browser.conftest import PHONE

STEP = re.compile(r"^Step \d+/\d+$")  # a progress event (service/job_runs.record_progress)
TERMINAL = {"succeeded", "failed", "cancelled"}


def _lines(n: int, tag: str = "") -> str:
    """JSONL training lines; a distinct `tag` makes a data set of its own: uploads that share
    lines share one budget group, and the tests here would otherwise spend each other's ε."""
    pats = ["ab", "cd", "ef"]
    return "".join(json.dumps({"text": pats[i % 3] * (6 + i % 5) + tag}) + "\n" for i in range(n))


class Watch:
    """Console errors, page errors and navigations of a page (a CSP violation is a console
    error; a reload is a navigation)."""

    def __init__(self, page):
        self.errors: list[str] = []
        self.navigations: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on(
            "console",
            lambda m: (
                self.errors.append(m.text)
                if m.type == "error" and "Failed to load resource" not in m.text
                else None
            ),
        )
        page.on(
            "framenavigated",
            lambda f: self.navigations.append(f.url) if f.parent_frame is None else None,
        )


def _sign_in(page, url: str, key: str) -> None:
    page.goto(f"{url}/sign-in")
    page.fill("#api_key", key)
    page.click("#sign-in")
    page.wait_for_url(f"{url}/")
    page.wait_for_selector("#who:has-text('Signed in as tenant')")


def test_a_bad_key_is_an_error_and_a_good_one_signs_in(dashboard, new_context):
    page = new_context().new_page()
    watch = Watch(page)
    page.goto(f"{dashboard.url}/jobs")  # not signed in: the sign-in page
    assert page.url == f"{dashboard.url}/sign-in"
    page.fill("#api_key", "dprc-this-is-not-a-key")
    page.click("#sign-in")
    error = page.locator("#sign-in-error")
    assert "incorrect API key" in error.inner_text()
    assert page.locator("#api_key").is_visible()  # the form again, not a blank page
    dashboard.shot(page, "sign_in_error")
    key = dashboard.key("alice")
    _sign_in(page, dashboard.url, key)
    assert page.locator("#tenant").inner_text() == "alice"
    page.wait_for_selector("#storage:has-text('Storage:')")
    storage = dashboard.api("alice").get("/v1/me").json()["storage"]
    assert int(page.locator("#storage").get_attribute("data-used-bytes")) == storage["used_bytes"]
    assert int(page.locator("#storage").get_attribute("data-quota-bytes")) == storage["quota_bytes"]
    dashboard.shot(page, "home")
    cookies = page.context.cookies()
    session = [c for c in cookies if c["name"] == "dprc_session"]
    assert len(session) == 1 and session[0]["httpOnly"] and session[0]["sameSite"] == "Strict"
    assert key not in session[0]["value"] and key not in page.content()
    for link in ("#go-data-sets", "#go-jobs", "#go-new-job", "#go-accountant"):
        assert page.locator(link).get_attribute("href").startswith("/")  # one click from home
    page.click("#sign-out")
    page.wait_for_url(f"{dashboard.url}/sign-in")
    assert not [c for c in page.context.cookies() if c["name"] == "dprc_session"]
    assert watch.errors == []


@pytest.mark.slow  # about a minute: a tiny job runs to the end, a second is cancelled
def test_upload_create_follow_download_cancel(dashboard, new_context, tmp_path):
    key = dashboard.key("alice")
    api = dashboard.api("alice")
    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, key)

    # 1. upload a data set with a budget, from the page
    data = tmp_path / "train.jsonl"
    data.write_text(_lines(48))
    page.click("nav >> text=Data sets")
    page.set_input_files("#upload-file", str(data))
    page.fill("#upload-epsilon", "9")
    page.click("#upload-submit")
    file_id = page.locator("#uploaded").get_attribute("data-file-id")
    listed = api.get(f"/v1/files/{file_id}").json()
    assert listed["n_examples"] == 48 and listed["budget"]["epsilon"] == 9.0
    bar = page.locator(f"#files article:has(li[data-file-id='{file_id}']) svg.bar rect.remaining")
    assert float(bar.get_attribute("data-epsilon")) == pytest.approx(9.0)

    # 2. the new-job form: a refusal in place, then the preview against the accountant
    page.click("nav >> text=New job")
    page.select_option("#training_file", file_id)
    page.select_option("#model", "dprc-tiny-llama")
    page.fill("#batch_size", "1000")  # more than N = 48
    page.wait_for_selector("#preview-error")
    assert "batch_size" in page.locator("#preview-error").inner_text()
    page.click("#submit-job")
    refusal = page.locator("#job-error")
    refusal.wait_for()
    assert (
        "batch_size" in refusal.inner_text() and "larger than the data set" in refusal.inner_text()
    )
    for field, value in (
        ("#target_epsilon", "8"),
        ("#n_epochs", "2"),
        ("#batch_size", "8"),
        ("#k", "16"),
        ("#learning_rate", "0.01"),
        ("#max_seq_len", "32"),
        ("#checkpoint_every", "4"),
    ):
        page.fill(field, value)
    page.select_option("#clipping", "hutch")
    plan = page.locator("#plan")
    page.wait_for_selector("#plan[data-steps='12']")  # ⌈2 · 48 / 8⌉
    shown = {
        a: plan.get_attribute(f"data-{a}")
        for a in (
            "noise-multiplier",
            "planned-epsilon",
            "sample-rate",
            "steps",
            "delta",
            "accounting-sketch",
        )
    }
    # the sketch select left at its default: per-example sketches for hutch
    assert shown["accounting-sketch"] == "per_example"
    acc = api.post(
        "/v1/accountant/noise_multiplier",
        json={
            "target_epsilon": 8.0,
            "target_delta": float(shown["delta"]),
            "sample_rate": float(shown["sample-rate"]),
            "steps": int(shown["steps"]),
            "clipping": "hutch",
            "k": 16,
            "sketch": "per_example",
        },
    ).json()
    assert float(shown["sample-rate"]) == 8 / 48
    assert float(shown["noise-multiplier"]) == pytest.approx(acc["noise_multiplier"], rel=1e-12)
    assert float(shown["planned-epsilon"]) == pytest.approx(acc["epsilon"], rel=1e-12)
    sigma_text = page.locator("#plan dd[data-key=sigma]").inner_text()
    assert float(sigma_text) == pytest.approx(acc["noise_multiplier"], rel=1e-4)
    assert page.locator("#verdict").inner_text() == "fits the budget"
    dashboard.shot(page, "new_job")

    # 3. create it; follow it to succeeded on its page, without a reload
    page.click("#submit-job")
    page.wait_for_url(re.compile(r".*/jobs/ftjob-[0-9a-f]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    job = api.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["privacy"]["noise_multiplier"] == acc["noise_multiplier"]
    page.evaluate("window.__sameDocument = 'yes'")
    loads = len(watch.navigations)
    page.wait_for_selector("#job-status:has-text('running'), #job-status:has-text('succeeded')")
    page.wait_for_selector("main[data-status='succeeded']", timeout=240_000)
    assert page.evaluate("window.__sameDocument") == "yes" and len(watch.navigations) == loads
    assert page.locator("#job-status").inner_text() == "succeeded"
    page.wait_for_selector("#checkpoint-table tr[data-step='12']")
    events = api.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}).json()
    progress = [e for e in events["data"] if e["type"] == "metrics" and STEP.match(e["message"])]
    assert len(progress) == 12

    def points(chart: str, series: str) -> int:
        return int(
            page.locator(f"#{chart} g.series[data-series='{series}']").get_attribute("data-points")
        )

    assert points("chart-epsilon", "actual") == len(progress)
    assert points("chart-loss", "loss") == len(progress)
    assert page.locator("#chart-epsilon g[data-series='actual'] circle").count() == len(progress)
    assert points("chart-epsilon", "planned") >= 2
    ckpt_steps = sorted(
        c["step_number"]
        for c in api.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"]
    )
    assert ckpt_steps == [4, 8, 12] and points("chart-epsilon", "checkpoints") == len(ckpt_steps)
    assert points("chart-clipped", "clipped") == len(progress)
    assert points("chart-dropped", "dropped") == len(progress)
    final = api.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert (
        page.locator("#epsilon-spent")
        .inner_text()
        .startswith(f"{final['privacy']['epsilon_spent']:.3f}")
    )
    dashboard.shot(page, "job", full_page=True)

    # 4. the last checkpoint and the ledger, downloaded: the API's bytes
    ckpts = api.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"]
    last = max(ckpts, key=lambda c: c["step_number"])
    with page.expect_download() as got:
        page.click("#checkpoint-table tr[data-step='12'] a.download")
    archive = Path(got.value.path())
    assert archive.read_bytes() == api.get(f"/v1/files/{last['file_id']}/content").content
    assert tarfile.is_tarfile(archive)
    with page.expect_download() as got:
        page.click("#ledger")
    ledger = json.loads(Path(got.value.path()).read_text())
    assert ledger == api.get(f"/v1/fine_tuning/jobs/{job_id}/ledger").json()

    # 5. the data set now shows the job that charged it, and its ε over time
    page.goto(f"{dashboard.url}/data-sets/{file_id}")
    page.wait_for_selector(f"#charges a:has-text('{job_id}')")
    hist = api.get(f"/v1/files/{file_id}/budget/history").json()
    assert int(
        page.locator("#history-chart g[data-series='spent']").get_attribute("data-points")
    ) == len(hist["data"])
    dashboard.shot(page, "data_set")
    page.goto(f"{dashboard.url}/data-sets")
    page.wait_for_selector(f"#files article:has(li[data-file-id='{file_id}']) .budget-words")
    dashboard.shot(page, "data_sets")

    # 6. a second job, cancelled from its page after the confirmation
    other = api.post(
        "/v1/files",
        files={"file": ("more.jsonl", _lines(48, " more").encode())},
        data={"purpose": "fine-tune"},
    ).json()
    second = api.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": "dprc-tiny-llama",
            "training_file": other["id"],
            "hyperparameters": {"n_epochs": 50, "batch_size": 8, "max_seq_len": 32},
            "privacy": {"target_epsilon": 8.0, "clipping": {"method": "exact"}},
        },
    ).json()
    page.goto(f"{dashboard.url}/jobs")
    page.wait_for_selector(f"#jobs tr[data-job-id='{second['id']}']")
    page.goto(f"{dashboard.url}/jobs/{second['id']}")
    page.wait_for_selector("#cancel:enabled")
    questions: list[str] = []

    def answer(dialog) -> None:
        questions.append(dialog.message)
        dialog.accept()

    page.once("dialog", answer)
    page.click("#cancel")
    page.wait_for_selector("main[data-status='cancelled']", timeout=120_000)
    assert questions and questions[0].startswith("Cancel this job?")
    assert api.get(f"/v1/fine_tuning/jobs/{second['id']}").json()["status"] == "cancelled"
    page.goto(f"{dashboard.url}/jobs")
    page.wait_for_selector(f"#jobs tr[data-job-id='{second['id']}'][data-status='cancelled']")
    page.wait_for_selector(f"#jobs tr[data-job-id='{job_id}'][data-status='succeeded']")
    dashboard.shot(page, "jobs")

    # 7. the accountant page: exact and randomized side by side, ε against steps
    page.goto(f"{dashboard.url}/accountant")
    page.wait_for_selector("#acc-chart g[data-series='randomized']")
    exact = float(page.locator("#sigma-exact").inner_text())
    randomized = float(page.locator("#sigma-rc").inner_text())
    assert randomized > exact  # randomized clipping needs more noise for the same ε
    assert "×" in page.locator("#overhead").inner_text()
    dashboard.shot(page, "accountant")

    # a phone's width: the job page still lays out (no horizontal scrolling of the page)
    phone = new_context(PHONE).new_page()
    _sign_in(phone, dashboard.url, key)
    phone.goto(f"{dashboard.url}/jobs/{job_id}")
    phone.wait_for_selector("main[data-status='succeeded']")
    phone.wait_for_selector("#checkpoint-table")
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"] + 1
    dashboard.shot(phone, "job_phone", full_page=True)

    assert watch.errors == []  # no script error, no CSP violation
    assert key not in dashboard.log.read_text()  # nor in the server's log


def test_another_tenants_job_and_data_set_are_404_pages(dashboard, new_context):
    owner = dashboard.api("alice")
    f = owner.post(
        "/v1/files",
        files={"file": ("a.jsonl", _lines(20, " other").encode())},
        data={"purpose": "fine-tune"},
    ).json()
    job = owner.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": "dprc-tiny-llama",
            "training_file": f["id"],
            "hyperparameters": {"n_epochs": 1, "batch_size": 5, "max_seq_len": 16},
            "privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}},
        },
    ).json()
    owner.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel")
    page = new_context().new_page()
    _sign_in(page, dashboard.url, dashboard.key("bob"))
    for path in (f"/jobs/{job['id']}", f"/data-sets/{f['id']}"):
        response = page.goto(f"{dashboard.url}{path}")
        assert response.status == 404, path
        assert "no such" in page.locator("#not-found").inner_text()
    dashboard.shot(page, "not_found")
    # and bob's job list does not show alice's job
    page.goto(f"{dashboard.url}/jobs")
    page.wait_for_selector("#jobs tbody tr")
    assert page.locator(f"#jobs tr[data-job-id='{job['id']}']").count() == 0
