"""Uploads that wait for a data owner (docs/governance.md, "Who sets and changes a budget"):
a trainer's upload is pending and not trainable; a data owner approves it with a budget (a new
data set), joins it to the data set it shares examples with, or rejects it (content deleted,
record kept); a second decision is refused; each decision is audited once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from service.base.errors import Conflict, InvalidInput, NotFound
from service.data import approvals, files
from tests.service.conftest import reviews


def _pending_queue(domain, caller) -> list[str]:
    rows, _ = files.list_files(domain.store, caller, None, 100, None, "desc", False, "pending")
    return [r.row.id for r in rows]


def test_a_trainers_upload_waits_and_is_not_trainable(domain):
    acme = domain.acme
    pending = domain.upload(acme.trainer, reviews(), epsilon=5.0)  # asks; does not set
    assert pending.row.approval == "pending"
    assert pending.budget is None and pending.group_id is None
    assert _pending_queue(domain, acme.owner) == [pending.row.id]
    with pytest.raises(Conflict) as refused:
        domain.create_job(acme.trainer, pending.row.id)
    assert refused.value.code == "pending_approval"
    assert refused.value.param == "training_file"
    assert "approve" in refused.value.message  # names who approves and how
    assert domain.audit(acme, "job.create") == []
    (entry,) = domain.audit(acme, "file.upload")
    assert entry.key_id == acme.trainer.key_id
    assert domain.audit(acme, "budget.set") == []  # the budget asked for is not set


def test_a_data_owner_names_a_budget_at_upload_and_it_is_set_at_once(domain):
    owned = domain.upload(domain.acme.owner, reviews(), epsilon=3.0)
    assert owned.row.approval == "approved"
    assert owned.budget is not None and owned.budget.epsilon == 3.0
    # δ defaults to 1/N^1.1 rounded down to two significant digits (docs/api.md), N = 40
    exact = 40**-1.1
    scale = 10 ** (math.floor(math.log10(exact)) - 1)
    assert owned.budget.delta == pytest.approx(math.floor(exact / scale) * scale, rel=1e-12)
    assert owned.budget.delta <= 1 / 40
    (entry,) = domain.audit(domain.acme, "budget.set")
    assert json.loads(entry.detail)["epsilon"] == 3.0


def test_an_owners_upload_naming_no_budget_waits_where_a_budget_is_required(domain):
    # DPRC_REQUIRE_BUDGET is on by default and there is no default budget
    waiting = domain.upload(domain.acme.owner, reviews())
    assert waiting.row.approval == "pending" and waiting.budget is None


def test_approval_makes_a_data_set_with_the_decided_budget(domain):
    acme = domain.acme
    pending = domain.upload(acme.trainer, reviews(), epsilon=50.0)
    decided = approvals.approve(
        domain.store,
        acme.owner,
        pending.row.id,
        approvals.Decision(reason="reviewed the sample", epsilon_budget=2.5, delta=0.01),
    )
    assert decided.row.approval == "approved"
    assert decided.row.decided_by == acme.owner.key_id
    assert decided.budget is not None
    assert (decided.budget.epsilon, decided.budget.delta) == (2.5, 0.01)  # not the 50 asked for
    assert decided.budget.committed == 0.0 and decided.group_id is not None
    assert _pending_queue(domain, acme.owner) == []
    job = domain.create_job(acme.trainer, pending.row.id, epsilon=1.0)  # trainable now
    assert job.training_file_id == pending.row.id
    (approve,) = domain.audit(acme, "file.approve")
    detail = json.loads(approve.detail)
    assert approve.key_id == acme.owner.key_id and approve.resource == pending.row.id
    assert detail["reason"] == "reviewed the sample"
    assert (detail["epsilon"], detail["delta"]) == (2.5, 0.01)
    assert detail["budget_group"] == decided.group_id
    (budget_set,) = domain.audit(acme, "budget.set")
    assert budget_set.resource == decided.group_id


def test_a_decision_needs_a_reason_and_a_budget(domain):
    acme = domain.acme
    pending = domain.upload(acme.trainer, reviews())
    with pytest.raises(InvalidInput) as no_reason:
        approvals.approve(
            domain.store, acme.owner, pending.row.id, approvals.Decision("  ", epsilon_budget=1.0)
        )
    assert no_reason.value.param == "reason"
    with pytest.raises(InvalidInput) as no_budget:
        approvals.approve(domain.store, acme.owner, pending.row.id, approvals.Decision("ok"))
    assert no_budget.value.param == "epsilon_budget"
    with pytest.raises(InvalidInput):
        approvals.reject(domain.store, acme.owner, pending.row.id, None)
    assert files.retrieve(domain.store, acme.owner, pending.row.id).row.approval == "pending"
    assert domain.audit(acme, "file.approve") == domain.audit(acme, "file.reject") == []


def test_rejection_deletes_the_content_and_keeps_the_record(domain):
    acme = domain.acme
    pending = domain.upload(acme.trainer, reviews())
    content = Path(pending.row.storage_path)
    assert content.exists()
    rejected = approvals.reject(domain.store, acme.owner, pending.row.id, "personal data")
    assert rejected.row.approval == "rejected" and rejected.row.deleted
    assert not content.exists()
    assert [p for p in content.parent.iterdir() if p.name.startswith(pending.row.id)] == []
    with pytest.raises(NotFound):
        files.content_path(domain.store, acme.owner, pending.row.id)
    with pytest.raises(NotFound):  # not trainable: it is gone
        domain.create_job(acme.trainer, pending.row.id)
    shown = files.retrieve(domain.store, acme.viewer, pending.row.id)  # the record stays
    assert shown.row.approval == "rejected"
    (entry,) = domain.audit(acme, "file.reject")
    assert json.loads(entry.detail)["reason"] == "personal data"


@pytest.mark.parametrize("first", ["approve", "reject"])
def test_a_second_decision_is_refused_and_not_audited(domain, first):
    acme = domain.acme
    pending = domain.upload(acme.trainer, reviews())
    approve = approvals.Decision(reason="fine", epsilon_budget=2.0)

    def decide(how: str, caller) -> None:
        if how == "approve":
            approvals.approve(domain.store, caller, pending.row.id, approve)
        else:
            approvals.reject(domain.store, caller, pending.row.id, "no")

    decide(first, acme.owner)
    after_first = len(domain.audit(acme))
    for second, caller in (("approve", acme.admin), ("reject", acme.owner)):
        with pytest.raises(Conflict) as refused:
            decide(second, caller)
        assert refused.value.code == "not_pending"
    assert len(domain.audit(acme)) == after_first
    assert len(domain.audit(acme, f"file.{first}")) == 1
    expected = "approved" if first == "approve" else "rejected"
    assert files.retrieve(domain.store, acme.owner, pending.row.id).row.approval == expected


def test_an_upload_sharing_examples_joins_the_data_set_and_its_budget(domain):
    acme = domain.acme
    original = domain.upload(acme.owner, reviews(40), epsilon=3.0)
    # a superset of the original's lines, by a trainer: it waits
    superset = domain.upload(acme.trainer, reviews(40) + reviews(10, "new"))
    assert superset.row.approval == "pending"
    new_budget = approvals.Decision(reason="a fresh budget", epsilon_budget=10.0)
    with pytest.raises(Conflict) as refused:  # it shares examples: it must join
        approvals.approve(domain.store, acme.owner, superset.row.id, new_budget)
    assert refused.value.code == "budget_group_conflict"
    assert original.group_id in refused.value.message
    join = approvals.Decision(reason="same data", budget_group=original.group_id)
    joined = approvals.approve(domain.store, acme.owner, superset.row.id, join)
    assert joined.group_id == original.group_id
    assert joined.budget is not None and joined.budget.epsilon == 3.0
    assert domain.audit(acme, "budget.set")[-1].resource == original.group_id  # no new budget
    assert len(domain.audit(acme, "budget.set")) == 1
