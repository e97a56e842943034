"""The dashboard's words for user-level DP (issue 31), in a real browser against a real
``dprc serve``: a data set whose lines name their users shows its users and a per-user budget;
a user-level job's privacy settings say that ε is per user, what a user contributes and N in
users. Every number shown is compared with the API's object (the test's independent view)."""

from __future__ import annotations

import json

from tests.browser.test_dashboard import _sign_in


def _user_lines() -> bytes:
    owners = ["p-heavy"] * 30 + [f"p-{i}" for i in range(12)]
    rows = [
        {"text": "ab" * (6 + i % 5) + f" notes {i}", "patient": o} for i, o in enumerate(owners)
    ]
    return ("".join(json.dumps(r) + "\n" for r in rows)).encode()


def test_user_level_data_set_and_job_pages_say_per_user(dashboard, new_context):
    api = dashboard.api("ursula")
    r = api.post(
        "/v1/files",
        files={"file": ("notes.jsonl", _user_lines())},
        data={"purpose": "fine-tune", "epsilon_budget": "5", "user_field": "patient"},
    )
    assert r.status_code == 200, r.text
    f = r.json()
    assert (f["n_users"], f["max_lines_per_user"], f["budget"]["unit"]) == (13, 30, "user")
    job = api.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": "dprc-tiny-llama",
            "training_file": f["id"],
            "hyperparameters": {"n_epochs": 1, "batch_size": 4, "max_seq_len": 32},
            "privacy": {
                "target_epsilon": 2.0,
                "unit": {"type": "user", "max_examples_per_user": 4},
            },
        },
    )
    assert job.status_code == 200, job.text
    p = job.json()["privacy"]

    page = new_context().new_page()
    _sign_in(page, dashboard.url, dashboard.key("ursula"))
    page.goto(f"{dashboard.url}/data-sets/{f['id']}")
    page.wait_for_selector(".budget-words")
    summary = page.locator("main").inner_text()
    assert "42 examples from 13 users (at most 30 lines each, field patient)" in summary
    assert "per user (all of one user's lines)" in page.locator(".budget-words").inner_text()

    page.goto(f"{dashboard.url}/jobs/{job.json()['id']}")
    page.wait_for_selector("#privacy-words dd")
    words = page.locator("#privacy-words").inner_text()
    assert "differential privacy at most per user" in words
    assert 'each line names its user in "patient"; 13 users, the largest with 30 lines' in words
    assert "at most 4 of their lines a step" in words
    assert f"at most 1/N for N = {p['dataset_size']} users" in words and p["dataset_size"] == 13
    assert "each user joins each batch independently" in words
    assert "each user's summed gradient is scaled" in words
    dashboard.shot(page, "job_user_level")

    # the new-job page: a per-user data set selects the user unit; the job created from the
    # form is a user-level job with the lines a user may give a step
    page.goto(f"{dashboard.url}/jobs/new?file={f['id']}")
    page.wait_for_selector("#plan")
    assert page.locator("#unit").input_value() == "user"
    assert page.locator("#batch-words").inner_text() == "Batch size (expected, users)"
    page.select_option("#model", "dprc-tiny-llama")
    page.fill("#target_epsilon", "1")
    page.fill("#n_epochs", "1")
    page.fill("#batch_size", "4")
    page.fill("#max_seq_len", "32")
    page.fill("#max_examples_per_user", "3")
    page.click("#submit-job")
    page.wait_for_url(f"{dashboard.url}/jobs/ftjob-*")
    made = api.get(f"/v1/fine_tuning/jobs/{page.url.rsplit('/', 1)[1]}").json()["privacy"]
    assert made["unit"]["type"] == "user" and made["unit"]["max_examples_per_user"] == 3
