"""OpenAI file objects, with the data set's size and privacy budget as extra fields."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Budget(BaseModel):
    """ε's at the budget's δ. ``spent`` composes the steps that ran; ``committed`` also the
    reservations of active jobs; ``reserved = committed − spent`` and
    ``remaining = epsilon − committed`` are differences of composed ε's (ε's do not add)."""

    epsilon: float
    delta: float
    spent: float | None = Field(description="null: no finite bound")
    reserved: float | None
    committed: float | None
    remaining: float


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None
    n_examples: int | None = None
    format: str | None = Field(default=None, description="text | classification | chat")
    budget: Budget | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BudgetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epsilon_budget: float = Field(gt=0, le=100, allow_inf_nan=False)
    delta: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="default: 1/N^1.1 rounded down (never above 1/N)",
    )


class BudgetPoint(BaseModel):
    """The file's composed ε once its jobs up to and including ``job_id`` (in creation order)
    are counted: ``spent`` composes the steps that ran, ``committed`` also the reservations of
    the jobs among them that are still active."""

    job_id: str
    job_status: str
    created_at: int
    finished_at: int | None
    job_epsilon_spent: float | None = Field(description="this job alone, at the file's δ")
    spent: float | None = Field(description="null: no finite bound")
    committed: float | None


class BudgetHistory(BaseModel):
    object: Literal["file.budget_history"] = "file.budget_history"
    file_id: str
    delta: float = Field(description="the budget's δ (unbudgeted: the default 1/N^1.1)")
    epsilon_budget: float | None
    data: list[BudgetPoint]
