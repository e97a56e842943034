"""One budget per data, not per upload: where a new upload's examples go.

Every fine-tune upload's examples are hashed (:mod:`service.data.example_hashes`). An upload that
shares no example with the tenant's earlier uploads starts a budget group of its own, with the
budget it names (or the tenant's default). One that shares any example with an existing group
joins it: it takes the group's budget, and the group's committed ε composes the jobs of all
its files (:mod:`service.budget.budget`). Deleting a file keeps its hashes and its group, so a
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
* a person is one unit (:mod:`service.data.user_groups`): an upload naming a user a group holds
  (same field, same id) shares that group, as a shared example does; one that holds a line of a
  per-user group under another user is 409 ``user_mapping_conflict``;
* the privacy unit: a group's budget is per user when its first file names its users
  (user-level DP, docs/privacy_unit.md), else per example; an upload whose unit differs from
  the group it shares examples with is 409 ``privacy_unit_conflict`` (one budget cannot be
  counted both ways). A per-user group's δ defaults to 1/U^1.1 (U its file's users).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select
from sqlalchemy.orm import Session

from dprc_core.training.plan import default_delta
from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, NotFound
from service.base.ids import new_id
from service.base.settings import Settings
from service.budget.budget import budget_values
from service.data.example_hashes import HashedData
from service.data.hash_recordings import check_free
from service.data.user_groups import add_pairs, check_mapping, user_overlap
from service.store.tables import BudgetGroup, ExampleHash, LegacyExampleHash

EXAMPLE_UNIT, USER_UNIT = "example", "user"


def unit_of(hashed: HashedData) -> str:
    """The privacy unit of an upload's budget: ``user`` when its lines name their users."""
    return USER_UNIT if hashed.users is not None else EXAMPLE_UNIT


def accounting_size(hashed: HashedData) -> int:
    """The N of the δ ≤ 1/N rule for an upload: its users, or its examples."""
    return hashed.users.n_users if hashed.users is not None else hashed.n_examples


LOOKUP_CHUNK = 500  # digests a lookup names
INSERT_CHUNK = 5000  # rows an insert (executemany, or a COPY on PostgreSQL) sends
MERGE_MIN = 100_000  # a merge reads at least this many of the tenant's hashes before giving up
READ_BLOCK = 10_000  # rows a merge fetches at a time
# what COPY's text format and a JSON string hold as it is (a digest is hex; an id letters,
# digits, - and _)
_PLAIN = re.compile(r"[0-9A-Za-z_-]+")


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


def overlap(session: Session, tenant_id: int, hashed: HashedData) -> dict[str, int]:
    """How many of the upload's distinct examples each existing budget group holds (by the
    canonical key, and by the raw-text key where the tenant keeps hashes that could not be
    re-keyed: :mod:`service.data.rekey`); groups sharing none are left out."""
    counts: dict[str, int] = {}
    lookups: list[tuple[Sequence[str], str]] = [(hashed.digests, ExampleHash.__tablename__)]
    if hashed.legacy_digests is not None:
        lookups.append((hashed.legacy_digests, LegacyExampleHash.__tablename__))
    for digests, table in lookups:
        for _i, group_id in held_digests(session, tenant_id, digests, table):
            counts[group_id] = counts.get(group_id, 0) + 1
    return counts


def held_digests(
    session: Session, tenant_id: int, digests: Sequence[str], table: str = "example_hashes"
) -> Iterator[tuple[int, str]]:
    """The upload's digests (sorted, distinct: :class:`~service.data.example_hashes.Digests`)
    that the tenant already holds in ``table``: (index in ``digests``, its group), in order.

    Two ways to the same answer, chosen by size: the tenant's hashes read in the order of the
    unique index and merged with the sorted digests (one pass over both: a tenant holding
    fewer hashes than the upload has examples — at 10⁷ a few seconds, where 20,000 lookups of
    500 took a minute), or, when the tenant holds more, lookups of ``LOOKUP_CHUNK`` digests
    (plain SQL through the driver: no statement compiled per chunk). The merge stops for the
    lookups as soon as it has read more hashes than the upload holds, or if the database's
    order is not the digests' (a collation other than bytewise: checked row by row)."""
    n = len(digests)
    if n == 0:
        return
    conn = session.connection()
    merged: list[tuple[int, str]] = []
    if _merge_held(conn, tenant_id, digests, table, merged):
        yield from merged
        return
    merged.clear()
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    for i in range(0, n, LOOKUP_CHUNK):
        chunk = digests[i : i + LOOKUP_CHUNK]
        sql = (
            f"SELECT digest, group_id FROM {table} WHERE tenant_id = {mark} AND digest IN "
            f"({', '.join([mark] * len(chunk))})"
        )
        found: dict[str, str] = {d: g for d, g in conn.exec_driver_sql(sql, (tenant_id, *chunk))}
        if found:
            for j, d in enumerate(chunk, start=i):
                g = found.get(d)
                if g is not None:
                    yield j, g


def _merge_held(
    conn: Connection, tenant_id: int, digests: Sequence[str], table: str, out: list[tuple[int, str]]
) -> bool:
    """The merge of :func:`held_digests` into ``out``; False when it gave up (the tenant holds
    more hashes than the upload, or the database's order is not bytewise)."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    limit = max(len(digests), MERGE_MIN)
    result = conn.exec_driver_sql(  # options of this statement only (not the connection's)
        f"SELECT digest, group_id FROM {table} WHERE tenant_id = {mark} ORDER BY digest",
        (tenant_id,),
        execution_options={"stream_results": True, "yield_per": READ_BLOCK},
    )
    try:
        mine = iter(enumerate(digests))
        i, d = next(mine)
        last, read = "", 0
        for held, group_id in result:
            read += 1
            if read > limit or held < last:
                return False
            last = held
            while d < held:
                nxt = next(mine, None)
                if nxt is None:
                    return True
                i, d = nxt
            if d == held:
                out.append((i, group_id))
        return True
    finally:
        result.close()


REPORT_GROUPS = 20  # groups a pending upload's report lists, most shared first


def overlap_report(session: Session, tenant_id: int, hashed: HashedData) -> dict[str, Any]:
    """What a data owner sees of a pending upload before deciding (:mod:`service.data.approvals`):
    its distinct examples (by the canonical key) and, for each existing budget group it shares
    examples with, how many, the group's unit and budget. Counts only: no text."""
    counts = overlap(session, tenant_id, hashed)
    users = user_overlap(session, tenant_id, hashed)
    for gid in users:
        counts.setdefault(gid, 0)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], -users.get(kv[0], 0), kv[0]))
    ranked = ranked[:REPORT_GROUPS]
    groups = {
        g.id: g
        for g in session.scalars(
            select(BudgetGroup).where(BudgetGroup.id.in_([gid for gid, _ in ranked]))
        )
    }
    return {
        "distinct_examples": len(hashed.digests),
        "groups": [
            {
                "budget_group": gid,
                "shared_examples": k,
                "shared_users": users.get(gid, 0),
                "privacy_unit": groups[gid].privacy_unit,
                "epsilon_budget": groups[gid].epsilon_budget,
                "delta": groups[gid].delta,
            }
            for gid, k in ranked
        ],
        "groups_total": len(counts),
    }


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
    session: Session,
    tenant_id: int,
    hashed: HashedData,
    wish: BudgetWish,
    settings: Settings,
    *,
    into: str | None = None,
    found: list[str] | None = None,
    record: bool = True,
    token: str | None = None,
) -> Placement:
    """Put an upload's examples in their group (under the tenant's lock; the caller
    commits): a new group, or the one existing group it shares examples with. ``into``: a data
    owner's decision to join the upload to that group (it may share no example with it: a near
    copy the hash does not see), refused when it shares examples with another group.

    Refused (:class:`~service.data.hash_recordings.RecordingBusy`) while another upload of the
    tenant records its hashes (``token``: the caller's own recording, which holds the lease and
    gives ``found``, the groups it shares examples or users with, looked up beforehand, and
    ``record=False``: its digests are recorded afterwards, in batches)."""
    check_free(session, tenant_id, token)
    if found is None:
        found = groups_shared(session, tenant_id, hashed)
    if into is not None and found and found != [into]:
        others = [g for g in found if g != into]
        raise Conflict(
            f"this upload shares examples with data set(s) {', '.join(others[:5])}, not only "
            f"with {into}: it can only join the group it shares examples with",
            param="budget_group",
            code="budget_group_conflict",
        )
    if into is not None:
        found = [into]
    if len(found) > 1:
        raise Conflict(
            f"this upload shares examples with {len(found)} data sets ({', '.join(found[:5])}), "
            "each with a budget of its own; split it, or delete the overlap",
            param="file",
            code="budget_group_conflict",
        )
    if found:
        group = session.scalar(
            select(BudgetGroup)
            .where(BudgetGroup.id == found[0], BudgetGroup.tenant_id == tenant_id)
            .with_for_update()
        )
        if group is None:
            raise NotFound(
                f"no such budget group: {found[0][:64]!r}",
                param="budget_group",
                code="budget_group_not_found",
            )
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
        refusal = None if into is not None else _join_refusal(group, wish, settings)
        if refusal is not None:
            raise Conflict(refusal, param="epsilon_budget", code="budget_group_conflict")
        if group.privacy_unit == USER_UNIT:
            check_mapping(session, tenant_id, group, hashed)
        if record:
            add_digests(session, tenant_id, group, hashed)
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
    if record:
        add_digests(session, tenant_id, group, hashed, fresh=True)
    return Placement(group, joined=False, budget_set=eps is not None, defaulted=defaulted)


def groups_shared(session: Session, tenant_id: int, hashed: HashedData) -> list[str]:
    """The groups an upload shares examples (or, per-user data, users) with, sorted."""
    return sorted(
        set(overlap(session, tenant_id, hashed)) | set(user_overlap(session, tenant_id, hashed))
    )


def add_digests(
    session: Session, tenant_id: int, group: BudgetGroup, hashed: HashedData, fresh: bool = False
) -> None:
    """Record the digests the group does not hold yet (they are distinct; memory is a chunk's
    and a bit a digest, whatever the data set's size). ``fresh``: the tenant holds none of them
    (:func:`overlap` found no group), so all are inserted without a lookup; otherwise
    the held ones are looked up first, all before the first insert (a bitmap marks them), so
    that no lookup reads rows this transaction inserted — on PostgreSQL those are missing from
    the statistics the lookups are planned with. Its ``n_examples`` (the N of the δ ≤ 1/N rule)
    is the larger of its distinct examples and its largest upload's lines."""
    digests = hashed.digests
    n = len(digests)
    held = None if fresh else held_bitmap(session, tenant_id, digests)
    insert_digests(session, tenant_id, group.id, digests, held, 0, n)
    add_pairs(session, tenant_id, group, hashed)
    group.n_examples = max(group_examples(session, group.id), group.n_examples, hashed.n_examples)


def group_examples(session: Session, group_id: str) -> int:
    """The distinct examples a group holds (its recorded hashes)."""
    distinct = session.scalar(
        select(func.count()).select_from(ExampleHash).where(ExampleHash.group_id == group_id)
    )
    return int(distinct or 0)


def held_bitmap(session: Session, tenant_id: int, digests: Sequence[str]) -> bytearray:
    """A bit for each of the digests: set when the tenant already holds it."""
    held = bytearray((len(digests) + 7) // 8)
    for j, _group in held_digests(session, tenant_id, digests):
        held[j >> 3] |= 1 << (j & 7)
    return held


def insert_digests(
    session: Session,
    tenant_id: int,
    group_id: str,
    digests: Sequence[str],
    held: bytearray | None,
    start: int,
    stop: int,
) -> int:
    """Insert ``digests[start:stop]`` for ``group_id``, those marked in ``held`` left out, in
    their (sorted) order, ``INSERT_CHUNK`` rows a statement, with no ORM row objects: ``COPY``
    on PostgreSQL (one text block), on SQLite one ``INSERT ... SELECT`` from ``json_each`` of
    the chunk's digests as a JSON array (SQLite reads the rows itself: ~2.5 µs a row against
    ~6.5 µs through ``executemany``, so the write lock is held less than half as long), else
    an ``executemany`` through the driver; how many."""
    conn = session.connection()
    raw: Any = conn.connection.dbapi_connection  # psycopg's on PostgreSQL (COPY)
    dialect = conn.dialect.name
    copy = dialect == "postgresql" and hasattr(raw, "cursor")
    plain_group = bool(_PLAIN.fullmatch(group_id))  # new_id's letters, digits and dashes
    json_each = dialect == "sqlite" and _json_each()
    added = 0
    for i in range(start, stop, INSERT_CHUNK):
        end = min(i + INSERT_CHUNK, stop)
        chosen = [
            d
            for j, d in enumerate(digests[i:end], start=i)
            if held is None or not held[j >> 3] & (1 << (j & 7))
        ]
        if not chosen:
            continue
        added += len(chosen)
        plain = plain_group and bool(_PLAIN.fullmatch("".join(chosen)))  # nothing to escape
        if copy and plain:  # COPY's text format, one block
            assert raw is not None
            head, tail = f"{int(tenant_id)}\t", f"\t{group_id}\n"
            with (
                raw.cursor() as cur,
                cur.copy("COPY example_hashes (tenant_id, digest, group_id) FROM STDIN") as out,
            ):
                out.write("".join([head + d + tail for d in chosen]))
            continue
        if json_each and plain:
            conn.exec_driver_sql(
                "INSERT INTO example_hashes (tenant_id, digest, group_id) "
                "SELECT ?, value, ? FROM json_each(?)",
                (tenant_id, group_id, '["' + '","'.join(chosen) + '"]'),
            )
            continue
        rows = [(tenant_id, d, group_id) for d in chosen]
        if copy:
            with (
                raw.cursor() as cur,
                cur.copy("COPY example_hashes (tenant_id, digest, group_id) FROM STDIN") as out,
            ):
                for row in rows:
                    out.write_row(row)
            continue
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        conn.exec_driver_sql(
            "INSERT INTO example_hashes (tenant_id, digest, group_id) "
            f"VALUES ({mark}, {mark}, {mark})",
            rows,
        )
    return added


@functools.cache
def _json_each() -> bool:
    """Whether this process's SQLite has ``json_each`` (built in since 3.38, and in most builds
    before): asked once."""
    import sqlite3

    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("""SELECT value FROM json_each('["a"]')""").fetchall()
    except sqlite3.OperationalError:  # pragma: no cover - a build without JSON1
        return False
    finally:
        probe.close()
    return True
