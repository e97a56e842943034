"""What a job's ε protects: one example (a line) or one user (all of a user's lines), and the
N the planner accounts with (docs/privacy_unit.md).

A data set whose lines name their users (``user_id``, or the field it was uploaded with) has a
per-user budget; jobs on it train at user level. An example-level job on it is refused: its ε
would protect a user with many lines only by group privacy, which the budget, counted per user,
cannot charge soundly without a group-privacy conversion whose δ explodes with the largest
user's lines. A data set without users trains at example level only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dprc_core.training.plan import PRIVACY_UNITS
from dprc_core.training.user_sampling import DEFAULT_EXAMPLES_PER_USER
from service.base.errors import InvalidInput
from service.base.settings import Settings
from service.store.tables import File

EXAMPLE, USER = "example", "user"
assert set(PRIVACY_UNITS) == {EXAMPLE, USER}


@dataclass(frozen=True)
class UnitRequest:
    """A job's ``privacy.unit`` as asked: the unit, and for users the field naming them (None:
    the data set's) and the most lines a sampled user contributes a step (None: the default)."""

    type: str = EXAMPLE
    field: str | None = None
    max_examples_per_user: int | None = None


@dataclass(frozen=True)
class JobUnit:
    """A job's privacy unit, resolved against its training file: ``n`` is the N of the
    accountant (its examples, or its users)."""

    type: str
    n: int
    field: str | None = None
    max_examples_per_user: int | None = None
    max_lines_per_user: int | None = None

    def stored(self) -> dict[str, Any]:
        """The job row's ``privacy.unit`` (read back by the worker and shown by reads)."""
        if self.type == EXAMPLE:
            return {"type": EXAMPLE}
        return {
            "type": USER,
            "field": self.field,
            "max_examples_per_user": self.max_examples_per_user,
            "n_users": self.n,
            "max_lines_per_user": self.max_lines_per_user,
        }


def file_unit(file: File) -> str:
    """The unit of a data set's budget: ``user`` when its lines name their users."""
    return USER if file.n_users is not None else EXAMPLE


def resolve_unit(file: File, asked: UnitRequest, settings: Settings) -> JobUnit:
    """The job's unit on ``file`` (a fine-tune data set), or 400 naming what does not fit."""
    has_users = file.n_users is not None
    if asked.type == EXAMPLE:
        if asked.field is not None or asked.max_examples_per_user is not None:
            raise InvalidInput(
                "field and max_examples_per_user apply to privacy.unit type 'user'",
                param="privacy.unit",
                code="invalid_value",
            )
        if has_users:
            raise InvalidInput(
                f"file {file.id} names its users (field {file.user_field!r}: {file.n_users} "
                f"users, up to {file.max_lines_per_user} lines each), so its budget is per user: "
                "train on it with privacy.unit {'type': 'user'}. An example-level ε would "
                f"protect a user with {file.max_lines_per_user} lines only by group privacy "
                "(docs/privacy_unit.md)",
                param="privacy.unit",
                code="privacy_unit_mismatch",
            )
        assert file.n_examples is not None
        return JobUnit(EXAMPLE, file.n_examples)
    if not has_users:
        raise InvalidInput(
            f"file {file.id} does not name its users: user-level DP needs every line to name "
            "its user, in 'user_id' or in the field the file was uploaded with (user_field); "
            "upload it so (docs/privacy_unit.md)",
            param="privacy.unit",
            code="privacy_unit_mismatch",
        )
    if asked.field is not None and asked.field != file.user_field:
        raise InvalidInput(
            f"privacy.unit.field={asked.field!r}: file {file.id} names its users in "
            f"{file.user_field!r} (the field it was uploaded with)",
            param="privacy.unit.field",
            code="privacy_unit_mismatch",
        )
    m = asked.max_examples_per_user
    largest = settings.max_physical_batch_size
    if m is None:
        m = min(DEFAULT_EXAMPLES_PER_USER, largest)
    elif m > largest:
        raise InvalidInput(
            f"max_examples_per_user={m} is larger than this service's micro-batch "
            f"(DPRC_MAX_PHYSICAL_BATCH_SIZE={largest}): a user's lines are clipped in one "
            "micro-batch",
            param="privacy.unit.max_examples_per_user",
            code="invalid_value",
        )
    assert file.n_users is not None
    return JobUnit(USER, file.n_users, file.user_field, m, file.max_lines_per_user)
