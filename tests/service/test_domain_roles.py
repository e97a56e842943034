"""Who may do what (docs/governance.md, "Roles"), checked on the domain's use cases in-process:
the expectations come from the documentation's table, the role and action names are only
enumerated from :mod:`service.governance.roles`. A refusal changes nothing, and another tenant's
record is not found (HTTP 404), as an unknown one."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from service.base.errors import NotFound, PermissionDenied
from service.budget import freezes
from service.data import approvals, files, uploads
from service.data.budget_groups import BudgetWish
from service.governance.roles import Action, Role, allowed
from service.jobs import jobs
from service.store.job_status import JobStatus
from tests.service.conftest import reviews

GOVERNANCE = Path(__file__).resolve().parents[2] / "docs" / "governance.md"


def documented_permissions() -> dict[tuple[str, str], bool]:
    """(role, action) → allowed, read from the table under "## Roles" in docs/governance.md."""
    text = GOVERNANCE.read_text()
    section = text.split("## Roles", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    header = next(line for line in section.splitlines() if line.startswith("| action"))
    roles = [cell.strip() for cell in header.strip("|").split("|")][2:]
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        action = re.fullmatch(r"`(\w+)`", cells[0])
        assert action is not None, row
        for role, mark in zip(roles, cells[2:], strict=True):
            assert mark in ("✓", ""), row
            table[(role, action.group(1))] = mark == "✓"
    return table


def test_the_documented_table_is_the_policy():
    table = documented_permissions()
    assert {r for r, _ in table} == {r.value for r in Role}
    assert {a for _, a in table} == {a.value for a in Action}
    for (role, action), expected in table.items():
        assert allowed(role, Action(action)) is expected, (role, action)
    assert not any(allowed("auditor", a) for a in Action)  # a role this version does not know


def test_a_trainer_neither_budgets_nor_decides_and_changes_nothing(domain):
    acme = domain.acme
    owned = domain.upload(acme.owner, reviews(40, "o"), epsilon=4.0)
    pending = domain.upload(acme.trainer, reviews(30, "t"))
    before = len(domain.audit(acme))
    with pytest.raises(PermissionDenied) as refused:
        files.set_budget(domain.store, acme.trainer, owned.row.id, 50.0, None, "more, please")
    assert refused.value.code == "permission_denied"
    decision = approvals.Decision(reason="mine", epsilon_budget=50.0)
    with pytest.raises(PermissionDenied):
        approvals.approve(domain.store, acme.trainer, pending.row.id, decision)
    with pytest.raises(PermissionDenied):
        approvals.reject(domain.store, acme.trainer, pending.row.id, "not wanted")
    with pytest.raises(PermissionDenied):
        approvals.set_policy(domain.store, acme.trainer, True, "let me budget")
    assert files.retrieve(domain.store, acme.owner, owned.row.id).budget.epsilon == 4.0
    assert files.retrieve(domain.store, acme.owner, pending.row.id).row.approval == "pending"
    assert len(domain.audit(acme)) == before


def test_a_viewer_only_reads(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=4.0)
    job = domain.create_job(acme.trainer, data_set.row.id)
    before = len(domain.audit(acme))
    store, viewer = domain.store, acme.viewer
    refusals = [
        lambda: domain.create_job(viewer, data_set.row.id),
        lambda: jobs.cancel(store, viewer, job.id),
        lambda: jobs.pause(store, viewer, job.id),
        lambda: domain.upload(viewer, reviews(20, "v"), epsilon=1.0),
        lambda: files.delete(store, viewer, data_set.row.id),
        lambda: files.content_path(store, viewer, data_set.row.id),
        lambda: files.set_budget(store, viewer, data_set.row.id, 5.0, None, "why not"),
    ]
    for attempt in refusals:
        with pytest.raises(PermissionDenied):
            attempt()
    # what a viewer may: read
    assert jobs.retrieve(store, viewer, job.id).status == JobStatus.QUEUED
    assert files.retrieve(store, viewer, data_set.row.id).row.id == data_set.row.id
    assert len(domain.audit(acme)) == before


def test_a_data_owner_controls_no_job(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=4.0)
    with pytest.raises(PermissionDenied):
        domain.create_job(acme.owner, data_set.row.id)
    job = domain.create_job(acme.trainer, data_set.row.id)
    for move in (jobs.cancel, jobs.pause, jobs.resume):
        with pytest.raises(PermissionDenied):
            move(domain.store, acme.owner, job.id)
    assert domain.job(job.id).status == JobStatus.QUEUED
    assert not domain.job(job.id).cancel_requested
    assert [e.action for e in domain.audit(acme, "job.create")] == ["job.create"]


def test_another_tenants_records_are_not_found(domain):
    acme, globex = domain.acme, domain.globex
    store, intruder = domain.store, globex.admin  # may do everything, in its own tenant
    data_set = domain.upload(acme.owner, reviews(), epsilon=4.0)
    pending = domain.upload(acme.trainer, reviews(30, "p"))
    job = domain.create_job(acme.trainer, data_set.row.id)
    upload = uploads.create(
        store,
        acme.owner,
        size=10,
        filename="u.jsonl",
        purpose="fine-tune",
        mime_type="text/jsonl",
        wish=BudgetWish(epsilon_budget=1.0),
    )
    before = len(domain.audit(acme))
    attempts = [
        lambda: files.retrieve(store, intruder, data_set.row.id),
        lambda: files.content_path(store, intruder, data_set.row.id),
        lambda: files.delete(store, intruder, data_set.row.id),
        lambda: files.set_budget(store, intruder, data_set.row.id, 9.0, None, "mine now"),
        lambda: approvals.approve(
            store, intruder, pending.row.id, approvals.Decision("ok", epsilon_budget=9.0)
        ),
        lambda: approvals.reject(store, intruder, pending.row.id, "no"),
        lambda: domain.create_job(intruder, data_set.row.id),
        lambda: jobs.retrieve(store, intruder, job.id),
        lambda: jobs.cancel(store, intruder, job.id),
        lambda: jobs.pause(store, intruder, job.id),
        lambda: freezes.acknowledge(store, intruder, data_set.group_id, "not frozen anyway"),
        lambda: uploads.add_part(store, intruder, upload.row.id, io.BytesIO(b"x")),
        lambda: uploads.cancel(store, intruder, upload.row.id),
    ]
    for attempt in attempts:
        with pytest.raises(NotFound):
            attempt()
    assert domain.job(job.id).status == JobStatus.QUEUED
    assert files.retrieve(store, acme.owner, data_set.row.id).budget.epsilon == 4.0
    assert len(domain.audit(acme)) == before
    assert domain.audit(globex, "file.download") == []
    listed, _ = files.list_files(store, intruder, None, 100, None, "desc", True)
    assert listed == []
