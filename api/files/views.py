"""The files domain's objects (:mod:`service.data.files`, :mod:`service.budget.budget`) as the API's
schemas."""

from __future__ import annotations

from typing import Literal, cast

from api.files.schemas import (
    Approval,
    Budget,
    BudgetHistory,
    BudgetPoint,
    FileObject,
    OverlapReport,
    RequestedBudget,
)
from service.budget.budget import History
from service.budget.planning import delta_warnings
from service.data.files import DataSet
from service.governance.keys import Caller
from service.governance.roles import Action, allowed


def _budget(data_set: DataSet) -> Budget | None:
    b, f = data_set.budget, data_set.row
    if b is None:
        return None
    n = f.n_users if b.unit == "user" else f.n_examples
    return Budget(
        warnings=delta_warnings(b.delta, n or 0, b.unit),
        epsilon=b.epsilon,
        delta=b.delta,
        spent=b.spent,
        reserved=b.reserved,
        committed=b.committed,
        remaining=b.remaining,
        unit=cast(Literal["example", "user"], b.unit),
    )


def decides(caller: Caller) -> bool:
    """Whether the caller approves uploads (data_owner, admin): a pending upload's report
    shows it the texts of the near duplicates (:mod:`service.data.near_copies`)."""
    return allowed(caller.role, Action.SET_BUDGET)


def _report(data_set: DataSet, may_decide: bool) -> OverlapReport | None:
    """The file's overlap report; the near duplicates' texts only to a caller who may decide
    on uploads, and only while the file's content is kept."""
    f = data_set.row
    if not f.overlap_report:
        return None
    report = OverlapReport(**f.overlap_report)
    if not may_decide or f.deleted:
        for group in report.groups:
            group.examples = None
    return report


def file_object(data_set: DataSet, *, may_decide: bool = False) -> FileObject:
    """``may_decide``: the caller approves uploads (the report's example texts are shown)."""
    f = data_set.row
    return FileObject(
        id=f.id,
        bytes=f.bytes,
        created_at=f.created_at,
        filename=f.filename,
        purpose=f.purpose,
        n_examples=f.n_examples,
        format=f.data_format,
        user_field=f.user_field,
        n_users=f.n_users,
        max_lines_per_user=f.max_lines_per_user,
        budget=_budget(data_set),
        budget_group=data_set.group_id,
        joined_budget_group=data_set.joined,
        budget_default=data_set.defaulted,
        unbudgeted=f.unbudgeted,
        synthetic=f.synthetic,
        deleted=f.deleted,
        deleted_at=f.deleted_at,
        created_by=f.created_by,
        approval=Approval(
            status=cast(Literal["approved", "pending", "rejected"], f.approval),
            requested_budget=RequestedBudget(**f.requested_budget) if f.requested_budget else None,
            report=_report(data_set, may_decide),
            decided_by=f.decided_by,
            decided_at=f.decided_at,
        ),
    )


def budget_history(file_id: str, history: History) -> BudgetHistory:
    return BudgetHistory(
        file_id=file_id,
        budget_group=history.group_id,
        delta=history.delta,
        epsilon_budget=history.epsilon_budget,
        data=[
            BudgetPoint(
                job_id=p.job.id,
                training_file=p.job.training_file_id,
                job_status=p.job.status,
                created_at=p.job.created_at,
                finished_at=p.job.finished_at,
                job_epsilon_spent=p.job_epsilon_spent,
                spent=p.spent,
                committed=p.committed,
            )
            for p in history.points
        ],
    )
