"""OpenAI file objects, with the data set's size and privacy budget as extra fields."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# strict JSON numbers: true, "7" and " 8 " are refused, not converted
Epsilon = Annotated[float, Field(strict=True, gt=0, le=100, allow_inf_nan=False)]
Delta = Annotated[
    float, Field(strict=True, ge=sys.float_info.min, lt=1, allow_inf_nan=False)
]  # no subnormal δ


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
    unit: Literal["example", "user"] = Field(
        default="example",
        description="what each ε protects: one example (line), or one user with all their "
        "lines (the data set's lines name their users; docs/privacy_unit.md)",
    )
    warnings: list[dict[str, str]] = Field(
        default_factory=list,
        description="e.g. delta_large: δ above 1/(10·N) for this file's N (its examples, or its "
        "users for a per-user budget), as a job's privacy.warnings",
    )


class NearExample(BaseModel):
    """One of the upload's examples and the group's example it nearly copies (private text:
    shown only to a data owner or an admin)."""

    line: int = Field(description="the upload's line (1-based)")
    text: str = Field(description="the upload's text (at most 500 characters)")
    group_text: str = Field(description="the group's text (at most 500 characters)")
    jaccard: float = Field(description="the Jaccard similarity of their word sets")


class OverlapGroup(BaseModel):
    budget_group: str
    shared_examples: int = Field(description="distinct examples (canonical key) both hold")
    shared_users: int = Field(
        default=0,
        description="users (same field, same id) both name: a person's budget follows them",
    )
    privacy_unit: str
    epsilon_budget: float | None
    delta: float | None
    near_duplicates: int = Field(
        default=0,
        description="the upload's other distinct examples that nearly copy one of the group's "
        "(word sets' Jaccard >= near_threshold)",
    )
    examples: list[NearExample] | None = Field(
        default=None,
        description="up to 3 near duplicates, first in the upload; only to a caller who "
        "approves uploads (data_owner, admin), while the file's content is kept",
    )


class OverlapReport(BaseModel):
    """What the pending upload shares with the tenant's budget groups, by the canonical key
    of each example, and its near copies (docs/governance.md, "What catches an edited
    copy")."""

    distinct_examples: int
    groups: list[OverlapGroup] = Field(
        description="most shared first, then groups with near duplicates only (at most 20)"
    )
    groups_total: int
    near_threshold: float | None = Field(
        default=None, description="the Jaccard from which an example is a near duplicate"
    )
    near_sample_limited: bool = Field(
        default=False,
        description="near duplicates were sought in the first 20000 examples of the upload "
        "and of each group only, and the upload or a group holds more",
    )


class RequestedBudget(BaseModel):
    epsilon: float | None = None
    delta: float | None = None


class Approval(BaseModel):
    """A data owner's decision on the upload (docs/governance.md, "Who sets a budget")."""

    status: Literal["approved", "pending", "rejected"]
    requested_budget: RequestedBudget | None = Field(
        default=None, description="what the uploader asked for (a pending upload's)"
    )
    report: OverlapReport | None = Field(
        default=None, description="computed at upload: its overlap with existing data sets"
    )
    decided_by: str | None = Field(default=None, description="the key that decided")
    decided_at: int | None = None


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
    user_field: str | None = Field(
        default=None, description="user-level DP: the field naming each line's user"
    )
    n_users: int | None = Field(
        default=None, description="the users its lines name (null: its lines name none)"
    )
    max_lines_per_user: int | None = Field(
        default=None, description="the most lines one user has (null: no users)"
    )
    budget: Budget | None = Field(
        default=None, description="the budget of the file's data set (its budget group)"
    )
    budget_group: str | None = Field(
        default=None,
        description="the data set this upload belongs to: every upload sharing an example "
        "with it shares its budget",
    )
    joined_budget_group: bool | None = Field(
        default=None,
        description="(upload answer only) true: the upload shares examples with an existing "
        "data set and joined its budget; false: it started a new one",
    )
    budget_default: bool | None = Field(
        default=None,
        description="(upload answer only) true: the budget is the tenant's default "
        "(DPRC_DEFAULT_EPSILON_BUDGET), the upload named none",
    )
    synthetic: dict[str, Any] | None = Field(
        default=None,
        description="a synthetic data set's provenance (written by its synthetic-data job, "
        "never by an upload): the source budget group, file and jobs, the privacy unit and the "
        "composed (epsilon, delta) of everything that read the private data",
    )
    unbudgeted: bool = Field(
        default=False, description="validation-only data: no budget, no job may train on it"
    )
    deleted: bool = Field(
        default=False,
        description="its content is gone; its budget, spent ε and history remain",
    )
    deleted_at: int | None = None
    created_by: str | None = Field(default=None, description="the id of the key that uploaded it")
    approval: Approval = Field(
        default_factory=lambda: Approval(status="approved"),
        description="pending: a data owner decides its budget before any job trains on it",
    )


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
    """A change of a data set's budget (admins only). A value left out keeps its current
    value; the change applies to the file's whole budget group."""

    model_config = ConfigDict(extra="forbid")

    epsilon_budget: Epsilon | None = None
    delta: Delta | None = Field(
        default=None,
        description="at most 1/N, N the data set's distinct examples (a data set without a "
        "budget gets 1/N^1.1 rounded down when this is left out)",
    )
    reason: str | None = Field(
        default=None,
        max_length=1000,
        description="required: why the budget changes (kept in the audit log)",
    )


class ApproveRequest(BaseModel):
    """A data owner's approval of a pending upload: a new budget (``epsilon_budget``, ``delta``)
    or an existing budget group to join (``budget_group``), with a reason."""

    model_config = ConfigDict(extra="forbid")

    epsilon_budget: Epsilon | None = None
    delta: Delta | None = Field(default=None, description="default: 1/N^1.1 rounded down")
    budget_group: str | None = Field(default=None, max_length=64)
    unit: Literal["example", "user"] | None = Field(
        default=None,
        description="the privacy unit the owner confirms: it must be the upload's (per user "
        "when its lines name their users)",
    )
    reason: str | None = Field(default=None, max_length=1000, description="required")


class RejectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=1000, description="required")


class BudgetPoint(BaseModel):
    """The file's composed ε once its jobs up to and including ``job_id`` (in creation order)
    are counted: ``spent`` composes the steps that ran, ``committed`` also the reservations of
    the jobs among them that are still active."""

    job_id: str
    training_file: str
    job_status: str
    created_at: int
    finished_at: int | None
    job_epsilon_spent: float | None = Field(description="this job alone, at the file's δ")
    spent: float | None = Field(description="null: no finite bound")
    committed: float | None


class BudgetHistory(BaseModel):
    object: Literal["file.budget_history"] = "file.budget_history"
    file_id: str
    budget_group: str
    delta: float = Field(description="the budget's δ (unbudgeted: the default 1/N^1.1)")
    epsilon_budget: float | None
    data: list[BudgetPoint]
