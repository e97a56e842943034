"""One budget per data, not per upload: where a new upload's examples go.

Every fine-tune upload's examples are hashed (:mod:`service.example_hashes`). An upload that
shares no example with the tenant's earlier uploads starts a budget group of its own, with the
budget it names (or the tenant's default). One that shares any example with an existing group
joins it: it takes the group's budget, and the group's committed ε composes the jobs of all
its files (:mod:`service.budget`). Deleting a file keeps its hashes and its group, so a
re-upload finds its spent ε again.

The rules, applied under the tenant's lock (uploads of a tenant take turns):

* no shared example: a new group with the upload's budget — the one it names, else the
  tenant's default (``DPRC_DEFAULT_EPSILON_BUDGET``), else, when ``DPRC_REQUIRE_BUDGET`` is on
  (the default), 400 ``budget_required``; ``unbudgeted=true`` asks for none (validation-only
  data: no job may train on it);
* shared examples with one budgeted group: joins it; naming a different budget is 409
  ``budget_group_conflict`` (only an admin changes a group's budget), and ``unbudgeted`` is 409;
* shared examples with one group without a budget: joins it only when the upload asks for no
  budget either; else 409 (an admin sets that group's budget first);
* shared examples with several groups: 409 naming them (the service never merges budgets);
* the privacy unit: a group's budget is per user when its first file names its users
  (user-level DP, docs/privacy_unit.md), else per example; an upload whose unit differs from
  the group it shares examples with is 409 ``privacy_unit_conflict`` (one budget cannot be
  counted both ways). A per-user group's δ defaults to 1/U^1.1 (U its file's users).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from dprc_core.training.plan import default_delta
from service.budget import budget_values
from service.clock import now
from service.errors import Conflict, InvalidInput
from service.example_hashes import HashedData
from service.ids import new_id
from service.settings import Settings
from service.tables import BudgetGroup, ExampleHash

EXAMPLE_UNIT, USER_UNIT = "example", "user"


def unit_of(hashed: HashedData) -> str:
    """The privacy unit of an upload's budget: ``user`` when its lines name their users."""
    return USER_UNIT if hashed.users is not None else EXAMPLE_UNIT


def accounting_size(hashed: HashedData) -> int:
    """The N of the δ ≤ 1/N rule for an upload: its users, or its examples."""
    return hashed.users.n_users if hashed.users is not None else hashed.n_examples


LOOKUP_CHUNK = 500  # digests a lookup names
INSERT_CHUNK = 5000  # rows an insert (executemany) sends


@dataclass(frozen=True)
class BudgetWish:
    """What an upload asks of its budget: ε and δ as named (None: not named), or none at all."""

    epsilon_budget: float | None = None
    delta: float | None = None
    unbudgeted: bool = False

    @property
    def named(self) -> bool:
        return self.epsilon_budget is not None or self.delta is not None


@dataclass(frozen=True)
class Placement:
    """The group an upload went to; ``joined``: an existing one; ``budget_set``: this upload
    set a new group's budget (an audited act); ``defaulted``: that budget is the tenant's
    default."""

    group: BudgetGroup
    joined: bool
    budget_set: bool
    defaulted: bool


def _existing_groups(session: Session, tenant_id: int, digests: Sequence[str]) -> list[str]:
    found: set[str] = set()
    for i in range(0, len(digests), LOOKUP_CHUNK):
        chunk = digests[i : i + LOOKUP_CHUNK]
        found.update(
            session.scalars(
                select(ExampleHash.group_id)
                .where(ExampleHash.tenant_id == tenant_id, ExampleHash.digest.in_(chunk))
                .distinct()
            )
        )
    return sorted(found)


def _new_budget(
    wish: BudgetWish, n: int, settings: Settings
) -> tuple[float | None, float | None, bool]:
    """(ε, δ, defaulted) of a new group of ``n`` distinct examples."""
    if wish.unbudgeted:
        if wish.named:
            raise InvalidInput(
                "unbudgeted=true and a budget exclude each other",
                param="unbudgeted",
                code="invalid_value",
            )
        return None, None, False
    if wish.named:
        if wish.epsilon_budget is None:
            raise InvalidInput("delta needs epsilon_budget", param="delta", code="invalid_value")
        eps, d = budget_values(n, wish.epsilon_budget, wish.delta)
        return eps, d, False
    if settings.default_epsilon_budget is not None:
        return settings.default_epsilon_budget, default_delta(n), True
    if settings.require_budget:
        raise InvalidInput(
            "this upload names no privacy budget and the tenant has no default: send "
            "epsilon_budget (and optionally delta), or unbudgeted=true for validation-only "
            "data that no job may train on",
            param="epsilon_budget",
            code="budget_required",
        )
    return None, None, False


def _join_refusal(group: BudgetGroup, wish: BudgetWish, settings: Settings) -> str | None:
    """Why an upload with ``wish`` may not join ``group`` (None: it may)."""
    if group.epsilon_budget is not None:
        if wish.unbudgeted:
            return (
                f"this upload shares examples with data set {group.id}, which has a budget "
                f"(epsilon={group.epsilon_budget:g}); it cannot be unbudgeted"
            )
        eps_differs = (
            wish.epsilon_budget is not None and wish.epsilon_budget != group.epsilon_budget
        )
        delta_differs = wish.delta is not None and wish.delta != group.delta
        if eps_differs or delta_differs:
            return (
                f"this upload shares examples with data set {group.id}, whose budget is "
                f"epsilon={group.epsilon_budget:g} at delta={group.delta:g}; it joins that "
                "budget, so it cannot ask for another one (only an admin changes a data "
                f"set's budget: POST /v1/files/{{id}}/budget). Upload it without a budget to "
                "join"
            )
        return None
    wants_none = wish.unbudgeted or (
        not wish.named and settings.default_epsilon_budget is None and not settings.require_budget
    )
    if wants_none:
        return None
    return (
        f"this upload shares examples with data set {group.id}, which has no budget; an admin "
        "sets its budget first (POST /v1/files/{id}/budget on one of its files), then upload "
        "without a budget to join it"
    )


def place(
    session: Session, tenant_id: int, hashed: HashedData, wish: BudgetWish, settings: Settings
) -> Placement:
    """Put an upload's examples in their group (under the tenant's lock; the caller
    commits): a new group, or the one existing group it shares examples with."""
    found = _existing_groups(session, tenant_id, hashed.digests)
    if len(found) > 1:
        raise Conflict(
            f"this upload shares examples with {len(found)} data sets ({', '.join(found[:5])}), "
            "each with a budget of its own; split it, or delete the overlap",
            param="file",
            code="budget_group_conflict",
        )
    if found:
        group = session.scalar(
            select(BudgetGroup).where(BudgetGroup.id == found[0]).with_for_update()
        )
        assert group is not None
        if group.privacy_unit != unit_of(hashed):
            raise Conflict(
                f"this upload shares examples with data set {group.id}, whose budget is per "
                f"{group.privacy_unit}; this upload's is per {unit_of(hashed)} (its lines "
                + ("name" if hashed.users is not None else "do not name")
                + " their users). One budget cannot be counted both ways: upload it as the "
                "data set was (docs/privacy_unit.md)",
                param="file",
                code="privacy_unit_conflict",
            )
        refusal = _join_refusal(group, wish, settings)
        if refusal is not None:
            raise Conflict(refusal, param="epsilon_budget", code="budget_group_conflict")
        _add_digests(session, tenant_id, group, hashed)
        return Placement(group, joined=True, budget_set=False, defaulted=False)
    eps, d, defaulted = _new_budget(wish, accounting_size(hashed), settings)
    group = BudgetGroup(
        id=new_id("bg"),
        tenant_id=tenant_id,
        created_at=now(),
        n_examples=0,
        epsilon_budget=eps,
        delta=d,
        epsilon_spent=0.0,
        epsilon_committed=0.0,
        privacy_unit=unit_of(hashed),
    )
    session.add(group)
    session.flush()
    _add_digests(session, tenant_id, group, hashed, fresh=True)
    return Placement(group, joined=False, budget_set=eps is not None, defaulted=defaulted)


def _add_digests(
    session: Session, tenant_id: int, group: BudgetGroup, hashed: HashedData, fresh: bool = False
) -> None:
    """Record the digests the group does not hold yet (they are distinct; memory is a chunk's
    and a bit a digest, whatever the data set's size). ``fresh``: the tenant holds none of them
    (:func:`_existing_groups` found no group), so all are inserted without a lookup; otherwise
    the held ones are looked up first, all before the first insert (a bitmap marks them), so
    that no lookup reads rows this transaction inserted — on PostgreSQL those are missing from
    the statistics the lookups are planned with. Its ``n_examples`` (the N of the δ ≤ 1/N rule)
    is the larger of its distinct examples and its largest upload's lines."""
    digests = hashed.digests
    n = len(digests)
    held = bytearray((n + 7) // 8)
    if not fresh:
        for i in range(0, n, LOOKUP_CHUNK):
            chunk = digests[i : i + LOOKUP_CHUNK]
            known = set(
                session.scalars(
                    select(ExampleHash.digest).where(
                        ExampleHash.tenant_id == tenant_id, ExampleHash.digest.in_(chunk)
                    )
                )
            )
            for j, d in enumerate(chunk, start=i):
                if d in known:
                    held[j >> 3] |= 1 << (j & 7)
    for i in range(0, n, INSERT_CHUNK):
        rows = [
            {"tenant_id": tenant_id, "digest": d, "group_id": group.id}
            for j, d in enumerate(digests[i : i + INSERT_CHUNK], start=i)
            if not held[j >> 3] & (1 << (j & 7))
        ]
        if rows:
            session.execute(insert(ExampleHash), rows)
    distinct = session.scalar(
        select(func.count()).select_from(ExampleHash).where(ExampleHash.group_id == group.id)
    )
    group.n_examples = max(int(distinct or 0), group.n_examples, hashed.n_examples)
