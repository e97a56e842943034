"""The files domain's objects (:mod:`service.files`, :mod:`service.budget`) as the API's
schemas."""

from __future__ import annotations

from api.files.schemas import Budget, BudgetHistory, BudgetPoint, FileObject
from service.budget import FileBudget, History
from service.files import DataSet


def _budget(b: FileBudget | None) -> Budget | None:
    if b is None:
        return None
    return Budget(
        epsilon=b.epsilon,
        delta=b.delta,
        spent=b.spent,
        reserved=b.reserved,
        committed=b.committed,
        remaining=b.remaining,
    )


def file_object(data_set: DataSet) -> FileObject:
    f = data_set.row
    return FileObject(
        id=f.id,
        bytes=f.bytes,
        created_at=f.created_at,
        filename=f.filename,
        purpose=f.purpose,
        n_examples=f.n_examples,
        format=f.data_format,
        budget=_budget(data_set.budget),
    )


def budget_history(history: History) -> BudgetHistory:
    return BudgetHistory(
        file_id=history.file_id,
        delta=history.delta,
        epsilon_budget=history.epsilon_budget,
        data=[
            BudgetPoint(
                job_id=p.job.id,
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
