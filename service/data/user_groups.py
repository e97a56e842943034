"""A person is one unit, everywhere: the users of per-user data sets in budget groups.

A data set whose lines name their users has a per-user budget (docs/privacy_unit.md). Two rules
keep that budget about people, not about how an upload labels them:

* **A person's budget follows the person.** Users are keyed within their namespace — the field
  naming them — by an HMAC with the tenant's secret
  (:func:`service.data.example_hashes.user_digest`).
  An upload naming a user that a group already holds shares that group (as one sharing an
  example does): it joins it, so "ε per user" bounds each person's total over every file that
  names them. Files that share no line but name the same people are one data set.
* **A line keeps its user.** Each line of a per-user group is recorded with its user
  (``example_users``). An upload that holds a line of the group under another user — the same
  lines renamed, split into pseudo-users or merged — is refused with 409
  ``user_mapping_conflict``: the group's users are the owner's mapping, and nothing a re-upload
  does may raise the number of users a budget is divided among for lines it already holds, or
  lower what a job is charged. The same text written by two people is recorded once for each:
  a later upload that adds a third person with that very text is refused too (its message says
  so); give the line as it is in the group, or ask a data owner.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from service.base.errors import Conflict
from service.data.example_hashes import HashedData
from service.store.tables import BudgetGroup, ExampleUser

LOOKUP_CHUNK = 500
INSERT_CHUNK = 5000
HEX = 64  # hex characters of one digest


def user_overlap(session: Session, tenant_id: int, hashed: HashedData) -> dict[str, int]:
    """How many of the upload's users (by keyed digest, in its users' namespace) each group
    already holds; groups holding none are left out."""
    counts: dict[str, int] = {}
    users = hashed.user_digests or ()
    for i in range(0, len(users), LOOKUP_CHUNK):
        chunk = users[i : i + LOOKUP_CHUNK]
        for group_id, k in session.execute(
            select(ExampleUser.group_id, func.count(func.distinct(ExampleUser.user_digest)))
            .where(ExampleUser.tenant_id == tenant_id, ExampleUser.user_digest.in_(chunk))
            .group_by(ExampleUser.group_id)
        ):
            counts[group_id] = counts.get(group_id, 0) + int(k)
    return counts


def _split(pairs: Sequence[str]) -> list[tuple[str, str]]:
    return [(p[:HEX], p[HEX:]) for p in pairs]


def check_mapping(session: Session, tenant_id: int, group: BudgetGroup, hashed: HashedData) -> None:
    """Refuse (409 ``user_mapping_conflict``) an upload holding a line of ``group`` under a
    user the group does not hold that line under."""
    pairs = hashed.pairs or ()
    moved, shown = 0, ""
    for i in range(0, len(pairs), LOOKUP_CHUNK):
        chunk = _split(pairs[i : i + LOOKUP_CHUNK])
        held = {
            (d, u)
            for d, u in session.execute(
                select(ExampleUser.digest, ExampleUser.user_digest).where(
                    ExampleUser.tenant_id == tenant_id,
                    ExampleUser.group_id == group.id,
                    ExampleUser.digest.in_({d for d, _ in chunk}),
                )
            )
        }
        lines = {d for d, _ in held}
        for pair in chunk:
            if pair[0] in lines and pair not in held:
                moved += 1
    if moved:
        shown = (
            f"{moved} of its lines belong to data set {group.id} under other users (renamed, "
            "split into pseudo-users, or merged). A per-user budget's users are its data "
            "owner's: upload the lines with the users they have in the group. (The same text "
            "written by a new person counts here too: leave that line out, or ask a data owner.)"
        )
        raise Conflict(
            "this upload names its users differently from the data set it shares lines with: "
            + shown,
            param="file",
            code="user_mapping_conflict",
        )


def add_pairs(session: Session, tenant_id: int, group: BudgetGroup, hashed: HashedData) -> None:
    """Record the upload's (line, user) pairs the tenant does not hold yet, for ``group``."""
    pairs = hashed.pairs or ()
    for i in range(0, len(pairs), INSERT_CHUNK):
        chunk = _split(pairs[i : i + INSERT_CHUNK])
        held: set[tuple[str, str]] = set()
        for j in range(0, len(chunk), LOOKUP_CHUNK):
            part = chunk[j : j + LOOKUP_CHUNK]
            held.update(
                (d, u)
                for d, u in session.execute(
                    select(ExampleUser.digest, ExampleUser.user_digest).where(
                        ExampleUser.tenant_id == tenant_id,
                        ExampleUser.digest.in_({d for d, _ in part}),
                    )
                )
            )
        rows = [
            {"tenant_id": tenant_id, "digest": d, "user_digest": u, "group_id": group.id}
            for d, u in chunk
            if (d, u) not in held
        ]
        if rows:
            session.execute(insert(ExampleUser), rows)
