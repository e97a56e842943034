"""The synthetic-data pages in a real browser (Debian's Chromium through Playwright) against a
real ``dprc serve`` (SQLite, the embedded worker): one job from a classification file, seeded
and followed through the JSON API (the test's independent view), then the list page, the job
page (its one ε as the API's ``privacy.epsilon``, the composition sentence, the released label
histogram, the result file's download, the owner's report) for an admin session, and the
report's refusal for a trainer's."""

from __future__ import annotations

import json
import random
import time

from tests.browser.test_dashboard import Watch, _sign_in


def _rows(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = rng.choice(["calm", "angry"])
        word = rng.choice(["fine", "ok", "nice"] if label == "calm" else ["bad", "awful", "mad"])
        out.append(json.dumps({"text": f"it is {word} {i} ({seed})", "label": label}))
    return ("\n".join(out) + "\n").encode()


def test_the_synthetic_pages(dashboard, new_context, tmp_path):
    api = dashboard.api("synthia")
    up = api.post(
        "/v1/files",
        files={"file": ("reviews.jsonl", _rows(48, 0))},
        data={"purpose": "fine-tune", "epsilon_budget": "12"},
    )
    assert up.status_code == 200, up.text
    held = api.post(
        "/v1/files",
        files={"file": ("held.jsonl", _rows(16, 1))},
        data={"purpose": "fine-tune", "unbudgeted": "true"},
    )
    assert held.status_code == 200, held.text
    created = api.post(
        "/v1/synthetic_data/jobs",
        json={
            "n": 6,
            "training_file": up.json()["id"],
            "fine_tuning": {
                "model": "dprc-tiny-llama",
                "hyperparameters": {"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
                "privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}},
            },
            "sampling": {"max_tokens": 8},
            "seed": 1,
            "holdout_file": held.json()["id"],
        },
    )
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 300
    while (job := api.get(f"/v1/synthetic_data/jobs/{job_id}").json())["status"] not in {
        "succeeded", "failed", "cancelled",
    }:  # fmt: skip
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job["status"] == "succeeded", job
    shown_eps = f"{job['privacy']['epsilon']:.3f}"  # the page's format (common.js, eps)

    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, dashboard.key("synthia"))
    page.click("nav a:has-text('Synthetic data')")
    page.wait_for_url(f"{dashboard.url}/synthetic")
    row = page.locator(f"tr[data-job-id='{job_id}'][data-status='succeeded']")
    row.wait_for()
    assert row.locator("td.records").inner_text().strip() == "6 / 6"
    assert row.locator("td.epsilon").inner_text().startswith(f"{shown_eps} at δ")
    dashboard.shot(page, "synthetic")
    # the form: the API's refusal in place (an unknown training file), nothing created
    page.fill("#syn-training-file", "file-does-not-exist")
    page.fill("#syn-n", "3")
    page.click("#syn-submit")
    error = page.locator("#syn-error")
    error.wait_for()
    assert "file-does-not-exist" in error.inner_text()
    assert page.url == f"{dashboard.url}/synthetic"
    assert len(api.get("/v1/synthetic_data/jobs").json()["data"]) == 1

    row.locator("a").click()
    page.wait_for_url(f"{dashboard.url}/synthetic/{job_id}")
    page.wait_for_selector("main[data-status='succeeded'] #report-table")
    assert page.locator("#epsilon").inner_text() == shown_eps
    assert "for each example" in page.locator("#privacy").inner_text()
    assert "composed from the fine-tuning job and the label histogram" in (
        page.locator("#composed").inner_text()
    )
    assert page.locator("#fine-tuning-link").get_attribute("href") == (
        f"/jobs/{job['fine_tuning_job']}"
    )
    hist = job["privacy"]["label_histogram"]
    assert page.locator("#histogram-table tbody tr").count() == len(hist["classes"])
    link = page.locator("#result-file")
    assert link.get_attribute("href") == f"/v1/files/{job['result_file']}/content"
    with page.expect_download() as dl:
        link.click()
    path = tmp_path / "records.jsonl"
    dl.value.save_as(path)
    assert path.read_bytes() == api.get(f"/v1/files/{job['result_file']}/content").content
    report = page.locator("#report-table").inner_text()
    auc = api.get(f"/v1/synthetic_data/jobs/{job_id}/report").json()["fidelity"]["two_sample_auc"]
    assert page.locator("[data-key='auc']").inner_text().startswith(f"{auc:.3g}")
    for words in ("two-sample AUC", "Fréchet", "TSTR vs TRTR", "exact copies", "shared substring"):
        assert words in report
    assert page.locator("#cancel").is_disabled()
    assert page.locator("#events li").count() >= 1
    dashboard.shot(page, "synthetic_job", full_page=True)
    assert watch.errors == []

    trainer = new_context().new_page()
    _sign_in(trainer, dashboard.url, dashboard.key("synthia", "trainer"))
    trainer.goto(f"{dashboard.url}/synthetic/{job_id}")
    forbidden = trainer.locator("#report-forbidden")
    forbidden.wait_for()
    assert forbidden.inner_text() == "Only admins and data owners see the report."
    assert trainer.locator("#epsilon").inner_text() == shown_eps
