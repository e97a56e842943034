"""The admin pages in a real browser: an admin creates a trainer key on the keys page (its
secret shown once), sees it listed, finds its ``key.create`` entry on the audit page and
filters the log; the trainer signs in with the new key and gets a 403 page on /keys, with no
admin entries in the menu, and a data set's budget read-only, which the admin changes with a
reason; the admin revokes the key after the confirmation, which ends the trainer's session.
No script error or CSP violation on the way."""

from __future__ import annotations

import pytest

from tests.browser.test_dashboard import Watch, _lines, _sign_in


def test_keys_and_audit_pages(dashboard, new_context):
    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, dashboard.key("dora", "admin"))
    assert page.locator("#role").inner_text() == "admin"

    # the keys page: create a trainer key, its secret shown once, listed with its role
    page.click("nav >> text=Keys")
    page.wait_for_url(f"{dashboard.url}/keys")
    page.fill("#key-name", "ci-trainer")
    page.select_option("#key-role", "trainer")
    page.click("#key-create")
    secret = page.locator("#new-key-secret").inner_text()
    key_id = page.locator("#new-key").get_attribute("data-key-id")
    assert secret.startswith("dprc-") and key_id
    row = page.locator(f"#key-table tr[data-key-id='{key_id}']")
    row.wait_for()
    assert row.get_attribute("data-role") == "trainer"
    assert row.get_attribute("data-state") == "active" and "ci-trainer" in row.inner_text()
    assert secret not in row.inner_text()
    listed = dashboard.api("dora").get("/v1/organization/api_keys").json()["data"]
    assert [k["role"] for k in listed if k["id"] == key_id] == ["trainer"]
    dashboard.shot(page, "keys")

    # the audit page lists the creation; the action filter narrows the log
    page.click("nav >> text=Audit log")
    page.wait_for_url(f"{dashboard.url}/audit")
    created = page.locator(f"#audit-table tr[data-action='key.create'][data-resource='{key_id}']")
    created.wait_for()
    dashboard.shot(page, "audit")
    page.select_option("#audit-action", "session.sign_in")
    page.click("#audit-apply")
    page.wait_for_selector("#audit-table tr[data-action='key.create']", state="detached")
    actions = page.locator("#audit-table tbody tr").evaluate_all(
        "rows => rows.map((r) => r.dataset.action)"
    )
    assert actions and set(actions) == {"session.sign_in"}

    # the trainer: no admin pages in the menu, a 403 page on /keys
    trainer = new_context().new_page()
    trainer_watch = Watch(trainer)
    _sign_in(trainer, dashboard.url, secret)
    assert trainer.locator("#role").inner_text() == "trainer"
    assert trainer.locator("nav >> text=Keys").count() == 0
    response = trainer.goto(f"{dashboard.url}/keys")
    assert response is not None and response.status == 403
    assert "may not manage keys" in trainer.locator("#forbidden").inner_text()

    # a data set's budget: read-only for the trainer, changed by the admin with a reason
    api = dashboard.api("dora")
    up = api.post(
        "/v1/files",
        files={"file": ("g.jsonl", _lines(30, " governed").encode())},
        data={"purpose": "fine-tune", "epsilon_budget": "4"},
    )
    assert up.status_code == 200, up.text
    file_id = up.json()["id"]
    trainer.goto(f"{dashboard.url}/data-sets/{file_id}")
    trainer.wait_for_selector("#budget-read-only")
    assert trainer.locator("#budget-form").count() == 0
    page.goto(f"{dashboard.url}/data-sets/{file_id}")
    page.wait_for_selector("svg.bar")
    page.fill("#budget-epsilon", "6")
    page.fill("#budget-reason", "second study approved")
    page.click("#budget-submit")
    page.wait_for_selector("#budget-changed")
    assert api.get(f"/v1/files/{file_id}").json()["budget"]["epsilon"] == pytest.approx(6.0)
    group = up.json()["budget_group"]  # the change is the data set's: its budget group's
    changes = api.get(
        "/v1/organization/audit_logs", params={"action": "budget.change", "resource": group}
    ).json()["data"]
    assert [(c["detail"]["file_id"], c["detail"]["reason"]) for c in changes] == [
        (file_id, "second study approved")
    ]

    # revoked after the confirmation: the trainer's session ends with it
    page.goto(f"{dashboard.url}/keys")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#key-table tr[data-key-id='{key_id}'] button.revoke")
    page.wait_for_selector(f"#key-table tr[data-key-id='{key_id}'][data-state='revoked']")
    trainer.goto(f"{dashboard.url}/jobs")
    assert trainer.url == f"{dashboard.url}/sign-in"
    assert watch.errors == [] and trainer_watch.errors == []
