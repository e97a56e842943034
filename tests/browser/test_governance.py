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


def test_a_data_owner_approves_a_trainers_upload_on_the_data_sets_page(dashboard, new_context):
    """The data-sets page: one card per budget group with its uploads inside; a trainer's
    upload waits in the queue (no decision form for the trainer), with its overlap; the data
    owner joins one copy to its group and rejects another; both decisions are audited."""
    api = dashboard.api("olga")
    owned = api.post(
        "/v1/files",
        files={"file": ("owned.jsonl", _lines(30, " olga").encode())},
        data={"purpose": "fine-tune", "epsilon_budget": "4"},
    ).json()
    group = owned["budget_group"]
    trainer_key, owner_key = dashboard.key("olga", "trainer"), dashboard.key("olga", "data_owner")
    trainer = new_context().new_page()
    trainer_watch = Watch(trainer)
    _sign_in(trainer, dashboard.url, trainer_key)
    trainer.goto(f"{dashboard.url}/data-sets")
    trainer.set_input_files(
        "#upload-file",
        files=[{"name": "copy.jsonl", "mimeType": "application/jsonl",
                "buffer": _lines(30, " OLGA").encode()}],
    )  # fmt: skip
    trainer.click("#upload-submit")
    trainer.wait_for_selector("#uploaded")
    assert "waits for a data owner" in trainer.locator("#uploaded").inner_text()
    copy_id = trainer.locator("#uploaded").get_attribute("data-file-id")
    card = trainer.locator(f"#pending article[data-file-id='{copy_id}']")
    card.wait_for()
    assert f"15 of its 15 examples with {group}" in card.locator(".overlap").inner_text()
    assert card.locator("form.decide").count() == 0  # a trainer does not decide
    other = api.post(
        "/v1/files",
        files={"file": ("other.jsonl", _lines(12, " junk").encode())},
        data={"purpose": "fine-tune"},
        headers={"Authorization": f"Bearer {trainer_key}"},
    ).json()

    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, owner_key)
    page.goto(f"{dashboard.url}/data-sets")
    card = page.locator(f"#pending article[data-file-id='{copy_id}']")
    card.wait_for()
    assert card.locator("select.join").input_value() == group  # the group it copies
    card.locator("input.reason").fill("same study, re-exported")
    card.locator("button.approve").click()
    joined = page.locator(
        f"#files article[data-budget-group='{group}'] li[data-file-id='{copy_id}']"
    )
    joined.wait_for()
    # one card for the group, both uploads inside
    assert page.locator(f"#files article[data-budget-group='{group}'] li").count() == 2
    dashboard.shot(page, "data_sets_queue")
    junk = page.locator(f"#pending article[data-file-id='{other['id']}']")
    junk.locator("input.reason").fill("not ours")
    page.once("dialog", lambda dialog: dialog.accept())
    junk.locator("button.reject").click()
    junk.wait_for(state="detached")
    assert api.get(f"/v1/files/{other['id']}").json()["approval"]["status"] == "rejected"
    decided = api.get("/v1/organization/audit_logs", params={"limit": 1000}).json()["data"]
    assert {(e["action"], e["resource"]) for e in decided} >= {
        ("file.approve", copy_id),
        ("file.reject", other["id"]),
    }
    assert watch.errors == [] and trainer_watch.errors == []
