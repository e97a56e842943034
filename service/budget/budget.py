"""Privacy budgets of data sets: the privacy events of a job and their composition.

A budget belongs to a data set's budget group (:class:`service.store.tables.BudgetGroup`): every
upload that shares an example with it is one of its files (:mod:`service.data.budget_groups`), and
the group's committed ε composes the jobs of all of them — an upper bound for every example in
the group, whichever file a job read it from. Below, "the group's jobs" are the jobs of all its
files (deleted ones included: a deletion never reopens a budget).

A group with a budget (ε_B, δ_B) accepts a job only if the composition of every job's
*committed* event stays within ε_B at δ_B. A job commits its whole planned event while it is
active — that is its reservation — and the event of the steps that actually ran once it has
ended (its settlement, :func:`settle`; which statuses are active is
:mod:`service.store.job_status`'s). The budget check composes all of them with the PLD accountant
under a lock on the group's row; ε's are never added. The composition is incremental
(:func:`dprc_core.accounting.history.epsilon_for_history`): a group's events keep their jobs'
creation order, with an empty slot for a job without an event, so a new job, a job's progress
or its end recomposes O(log n) cached blocks instead of the whole history.

Every budget rule is here: the events a job commits, the totals of a file, the settlement a
job's end triggers, the optimistic snapshot job creation composes outside the locks, the
reservation (or refusal) of a new job — a frozen group (after a restore) refuses every one —,
a budget's values and its change, the numbers a data set shows and its history, and a plan's
preview against the budget.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyEvent
from dprc_core.accounting.accountant_process import AccountantProcess
from dprc_core.accounting.history import build_leaves, epsilon_for_history, tail_is_new
from dprc_core.accounting.memory import release_if_big, trim_if_big
from dprc_core.training.plan import check_delta_for_size, default_delta
from service.base.errors import Conflict, InvalidInput
from service.store.job_status import ACTIVE, JobStatus
from service.store.metrics import BUDGET_REFUSALS
from service.store.tables import BudgetGroup, File, Job, SyntheticJob


def planned_event(job: Job) -> PrivacyEvent:
    """The job's planned privacy event: the one stored form, ``privacy.event`` (written at
    creation, re-accounted in place when an ``auto`` job resolves to exact norms; migration
    0012 wrote it for older jobs), read by the event classes' registry."""
    return event_from_dict(job.privacy["event"])


def spent_event(job: Job) -> PrivacyEvent | None:
    """The steps that ran (the worker counts a step as soon as it starts): the planned
    event's first ``steps_done`` steps."""
    return _spent(planned_event(job), job.steps_done)


def event_from_dict(data: Any) -> PrivacyEvent:
    """``PrivacyEvent.from_dict(data)``, read once per distinct stored event in a process (a
    group's events are read several times by every create: :func:`group_events`)."""
    if not isinstance(data, dict):
        return PrivacyEvent.from_dict(data)  # its refusal
    return _event_of_json(json.dumps(data, sort_keys=True))


@lru_cache(maxsize=8192)  # a few MB at most: one entry per distinct stored event
def _event_of_json(text: str) -> PrivacyEvent:
    return PrivacyEvent.from_dict(json.loads(text))


@lru_cache(maxsize=8192)  # a few MB at most: one entry per distinct stored event
def _first_steps(event: PrivacyEvent, steps: int) -> PrivacyEvent:
    return event.first_steps(steps)


def _spent(planned: PrivacyEvent, steps_done: int) -> PrivacyEvent | None:
    return None if steps_done <= 0 else _first_steps(planned, steps_done)


def compose(events: Sequence[PrivacyEvent | None], delta: float) -> float:
    """ε of the composition of ``events`` (slots in the file's job order, ``None`` for a job
    without an event); +inf (fits no budget) when the accountant cannot bound it. Incremental
    across calls (:func:`epsilon_for_history`): keep a job in its slot from call to call."""
    try:
        return _compose(events, delta)
    finally:
        trim_if_big()  # the ε of a big cached composition: its temporaries' pages back


def _compose(events: Sequence[PrivacyEvent | None], delta: float) -> float:
    """:func:`compose` for callers that compose several times and trim once after
    (:func:`trim_if_big`: each trim hands the pages back, the next composition faults them
    in again); a composition that ran big transforms releases at once as before."""
    try:
        return epsilon_for_history(events, delta)
    except ValueError:
        return math.inf
    finally:
        release_if_big()  # a big job's leaf: its FFT plans and freed pages back


# The group's ``spent`` as its jobs run: the stored value is refreshed when a job is created,
# ends or the budget changes; a read composes the steps that ran so far instead, at most once
# every SPENT_REFRESH_SECONDS per group (a running job's slot changes with every step; each
# change recomposes O(log n) blocks of the group's history).
SPENT_REFRESH_SECONDS = 2.0
_LIVE_MAX = 4096
_live: OrderedDict[str, tuple[float, tuple[PrivacyEvent | None, ...], float]] = OrderedDict()
_live_guard = threading.Lock()


def live_spent(session: Session, group: BudgetGroup) -> float:
    """ε spent on a budgeted group now, at its δ: the composition of the events of the steps
    each of its jobs has run (a running job's ``steps_done`` so far), as the settlement
    composes them; at most SPENT_REFRESH_SECONDS old."""
    if group.delta is None:
        return 0.0
    t = time.monotonic()
    with _live_guard:
        hit = _live.get(group.id)
    if hit is not None and t - hit[0] < SPENT_REFRESH_SECONDS:
        return hit[2]
    releases = group_releases(session, group.id)
    events = tuple(
        [spent_event(j) for j in group_jobs(session, group.id)]
        + [release_spent(r) for r in releases]
    )
    if hit is not None and hit[1] == events:
        value = hit[2]
    else:
        value = compose(list(events), group.delta)
    with _live_guard:
        _live[group.id] = (t, events, value)
        _live.move_to_end(group.id)
        while len(_live) > _LIVE_MAX:
            _live.popitem(last=False)
    return value


def lock_group(session: Session, group_id: str) -> BudgetGroup:
    """The budget group, its row locked for the rest of the transaction (FOR UPDATE on
    PostgreSQL; on SQLite the caller's transaction began with BEGIN IMMEDIATE, see
    :func:`service.store.db.locked_session`)."""
    group = session.scalar(select(BudgetGroup).where(BudgetGroup.id == group_id).with_for_update())
    assert group is not None, group_id
    return group


def group_of(session: Session, file: File) -> BudgetGroup | None:
    """The budget group of a fine-tune data set (None for other files), unlocked."""
    if file.group_id is None:
        return None
    return session.scalar(select(BudgetGroup).where(BudgetGroup.id == file.group_id))


def group_units(session: Session, group: BudgetGroup) -> int:
    """The N of a group's δ ≤ 1/N rule: its distinct examples, or for a per-user group the
    users of its largest file (docs/privacy_unit.md)."""
    if group.privacy_unit != "user":
        return group.n_examples
    users = session.scalar(select(func.max(File.n_users)).where(File.group_id == group.id))
    return int(users or 0) or group.n_examples


def group_delta(session: Session, group: BudgetGroup) -> float:
    """The δ a group states its ε's at: its budget's, else (no budget) 1/N^1.1 rounded down of
    its units (:func:`group_units`). A job's default δ (service/budget/planning.py), so that the job
    and its data set state one (ε, δ)."""
    if group.delta is not None:
        return group.delta
    return default_delta(group_units(session, group))


def group_jobs(session: Session, group_id: str) -> list[Job]:
    """The jobs of every file of the group in creation order (the slots of its budget's
    history)."""
    query = (
        select(Job)
        .join(File, File.id == Job.training_file_id)
        .where(File.group_id == group_id)
        .order_by(Job.seq)
    )
    return list(session.scalars(query))


def group_releases(session: Session, group_id: str) -> list[SyntheticJob]:
    """The group's synthetic-data jobs in creation order: each may release a label histogram
    (docs/synthetic.md), composed with the jobs' events in the slots after theirs."""
    query = select(SyntheticJob).where(SyntheticJob.group_id == group_id).order_by(SyntheticJob.seq)
    return list(session.scalars(query))


def release_planned(row: SyntheticJob) -> PrivacyEvent | None:
    """A synthetic-data job's planned release (its label histogram's event), or None when its
    labels are public."""
    event = (row.privacy or {}).get("event")
    return None if event is None else PrivacyEvent.from_dict(event)


def release_spent(row: SyntheticJob) -> PrivacyEvent | None:
    """The release once drawn (the worker records it before using it), else None."""
    return release_planned(row) if (row.privacy or {}).get("released") else None


def release_committed(row: SyntheticJob) -> PrivacyEvent | None:
    """Its reservation while the job is active; what was drawn once it ended."""
    if JobStatus(row.status) in ACTIVE:
        return release_planned(row)
    return release_spent(row)


def check_delta_for(n: int, delta: float, param: str) -> float:
    """The library's rule (0 < δ ≤ 1/N), as a domain error naming ``param``."""
    try:
        return check_delta_for_size(delta, n)
    except ValueError as exc:
        raise InvalidInput(f"{param}: {exc}", param=param, code="invalid_delta") from exc


def budget_values(
    n: int, epsilon_budget: float | None, delta: float | None
) -> tuple[float | None, float | None]:
    """(ε_B, δ_B) of a data set of ``n`` examples: none without ``epsilon_budget``; δ the
    given one (at most 1/N) or 1/N^1.1 rounded down."""
    if epsilon_budget is None:
        if delta is not None:
            raise InvalidInput("delta needs epsilon_budget", param="delta", code="invalid_value")
        return None, None
    d = default_delta(n) if delta is None else check_delta_for(n, delta, "delta")
    return epsilon_budget, d


# -- a file's events and their totals ---------------------------------------------------------


def committed_event(job: Job) -> PrivacyEvent | None:
    """A job's share of its file's budget: its whole plan while active, what ran once ended."""
    if JobStatus(job.status) in ACTIVE:
        return planned_event(job)
    return spent_event(job)


GroupEvents = tuple[tuple[PrivacyEvent | None, ...], tuple[PrivacyEvent | None, ...]]
# a group's events and their totals with a new job's event, composed under no lock
Snapshot = tuple[GroupEvents, tuple[float, float]] | None


def group_events(session: Session, group: BudgetGroup) -> GroupEvents:
    """(spent, committed) events of a group's jobs, one slot per job in creation order (``None``
    for a job without such an event), then one per synthetic-data job (its label histogram's
    release, :func:`release_spent`): what its budget composes. Equal snapshots compose to
    equal ε (the optimistic check of job creation), and a job keeps its slot, so composing a
    changed snapshot reuses the blocks that did not change (:func:`compose`)."""
    rows = session.execute(
        select(Job.status, Job.steps_done, Job.privacy["event"])
        .join(File, File.id == Job.training_file_id)
        .where(File.group_id == group.id)
        .order_by(Job.seq)
    ).all()  # what the events need, the stored event only of the privacy object (a create
    # reads them three times: parsing each job's whole privacy object cost as much as the
    # snapshot's composition, docs/benchmarks/budget.md)
    releases = group_releases(session, group.id)
    spent: list[PrivacyEvent | None] = []
    committed: list[PrivacyEvent | None] = []
    for status, steps_done, stored in rows:
        planned = event_from_dict(stored)
        ran = _spent(planned, steps_done)
        spent.append(ran)
        committed.append(planned if JobStatus(status) in ACTIVE else ran)
    return (
        tuple(spent + [release_spent(r) for r in releases]),
        tuple(committed + [release_committed(r) for r in releases]),
    )


def totals(
    events: GroupEvents, delta: float, extra: PrivacyEvent | None = None
) -> tuple[float, float]:
    """(spent, committed) composed ε of a group's events at δ, ``extra`` counted as committed
    in the slot after the group's jobs (where a job being created will be). Pure, and incremental
    through :func:`compose`: a state composed before costs a cache lookup, one more job
    O(log n) block compositions."""
    try:
        return _totals(events, delta, extra)
    finally:
        trim_if_big()


def _totals(
    events: GroupEvents, delta: float, extra: PrivacyEvent | None = None
) -> tuple[float, float]:
    spent, committed = events
    return (
        _compose(list(spent), delta),
        _compose([*committed, extra] if extra is not None else list(committed), delta),
    )


def settle(
    session: Session,
    group: BudgetGroup,
    extra: PrivacyEvent | None = None,
    known: Snapshot = None,
    events: GroupEvents | None = None,
) -> tuple[float, float]:
    """Recompute (spent, committed) ε of a budgeted group at its δ, with ``extra`` (a job about
    to be created) counted as committed; stores them on the row. Call under the group's lock.
    ``known``: a snapshot of the group's events and its totals computed outside the lock; used
    as is when the group's events are still those (no composition under the lock).
    ``events``: the group's events as read under this lock (else read here)."""
    if group.delta is None:
        return 0.0, 0.0
    if events is None:
        events = group_events(session, group)
    if known is not None and known[0] == events:
        spent, committed = known[1]
    else:
        spent, committed = totals(events, group.delta, extra)
    group.epsilon_spent = spent
    group.epsilon_committed = committed
    return spent, committed


# -- a new job against its group's budget ----------------------------------------------------


def snapshot(
    events: GroupEvents,
    delta: float,
    privacy_event: PrivacyEvent,
    epsilon_budget: float,
    accountant: AccountantProcess | None = None,
) -> Snapshot:
    """``events`` with their totals with ``privacy_event``, composed under no lock; when the
    job does not fit ``epsilon_budget``, the totals without it too: they warm the cache for
    the refusal's message (composed under the lock otherwise). A job that fits does not
    compose them: its create needs only the totals with it.

    With an ``accountant`` process, a committed history whose total steps crossed into a new
    tail since this process last composed one (:func:`~dprc_core.accounting.history
    .tail_is_new`: every leaf is built again, on a new grid) has its leaves built there
    first, as :func:`build_leaf` does: the process's next leaf of the group needs them too,
    and would otherwise build them a second time."""
    if accountant is not None:
        slots = [*events[1], privacy_event]
        try:
            new_tail = tail_is_new(slots, delta)
        except ValueError:
            new_tail = False  # the composition says so (+inf)
        if new_tail:
            build_leaf(events, delta, privacy_event, accountant)
    try:
        with_job = _totals(events, delta, privacy_event)
        if not with_job[1] <= epsilon_budget:
            _totals(events, delta)
        return events, with_job
    finally:
        trim_if_big()


def build_leaf(
    events: GroupEvents,
    delta: float,
    privacy_event: PrivacyEvent,
    accountant: AccountantProcess | None = None,
) -> None:
    """Build and cache the leaf of ``privacy_event`` in the group's committed history (its PLD
    on the history's grid, :func:`dprc_core.accounting.history.build_leaves`), composing
    nothing else: the part of a new job's budget check that other jobs committing meanwhile
    do not make stale (unless they move the grid), done under no lock before :func:`snapshot`.
    With an ``accountant`` process, built there and kept in this process's caches."""
    slots = [*events[1], privacy_event]
    try:
        if accountant is not None:
            accountant.build_leaves(slots, delta, [privacy_event])
        else:
            build_leaves(slots, delta)
    except ValueError:
        pass  # the snapshot says so (compose: +inf)
    finally:
        release_if_big()


def changed_events(session: Session, group: BudgetGroup, known: Snapshot) -> GroupEvents | None:
    """The group's events when they differ from the snapshot ``known`` (another job changed
    the group since), else None; an unbudgeted group never changes its budget."""
    if group.epsilon_budget is None or group.delta is None:
        return None
    events = group_events(session, group)
    if known is None or known[0] != events:
        return events
    return None


def budget_of(group: BudgetGroup) -> float:
    """The group's ε budget (+∞ for a group without one: every job fits)."""
    return math.inf if group.epsilon_budget is None else group.epsilon_budget


def refuse_if_frozen(session: Session, group: BudgetGroup) -> None:
    """Refuse a new job on a frozen group (409 ``budget_group_frozen``, the transaction rolled
    back): a restore froze it because jobs ran on it after the backup, so what it spent is
    unknown (:mod:`service.budget.freezes`). Call under the group's lock."""
    if group.frozen_reason is None:
        return
    session.rollback()
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(group.frozen_at or 0))
    raise Conflict(
        f"data set {group.id} is frozen since {since}: {group.frozen_reason} No new job may "
        f"train on it until an admin acknowledges it (`dprc admin acknowledge {group.id} "
        f"--reason TEXT` on the server, or POST /v1/organization/budget_groups/{group.id}/"
        "acknowledge with a reason)",
        param="training_file",
        code="budget_group_frozen",
    )


def reserve(
    session: Session,
    group: BudgetGroup,
    privacy_event: PrivacyEvent,
    known: Snapshot,
    planned_epsilon: float,
    target_delta: float,
    checked: bool = False,
) -> None:
    """Refuse the job whose planned event is ``privacy_event`` (planned ε ``planned_epsilon`` at
    its δ ``target_delta``) if its group is frozen (:func:`refuse_if_frozen`) or if the composed
    ε of the group's events with it exceeds the group's budget (never a sum of ε's); else store
    the new totals. Call under the group's lock; ``checked``: the group's events were read
    under it and are ``known``'s (:func:`changed_events` found no change)."""
    refuse_if_frozen(session, group)
    if group.epsilon_budget is None or group.delta is None:
        return
    events = known[0] if checked and known is not None else None
    spent, committed = settle(session, group, extra=privacy_event, known=known, events=events)
    if committed <= group.epsilon_budget:
        return
    _before, current = totals(
        events if events is not None else group_events(session, group), group.delta
    )
    session.rollback()
    BUDGET_REFUSALS.inc()
    remaining = max(0.0, group.epsilon_budget - current)
    raise Conflict(
        f"privacy budget of data set {group.id} exceeded (it covers every upload that shares "
        f"an example with it): budget epsilon="
        f"{group.epsilon_budget:g} at delta={group.delta:g}; already committed "
        f"epsilon={current:.4g} (spent {spent:.4g}); remaining epsilon="
        f"{remaining:.4g}; this job (planned epsilon={planned_epsilon:.4g} at "
        f"its delta={target_delta:g}) would bring the composed epsilon to "
        f"{committed:.4g}",
        param="training_file",
        code="budget_exceeded",
    )


@dataclass(frozen=True)
class PlanFit:
    """A planned job against its training file's budget (composed ε's at the budget's δ)."""

    epsilon: float
    delta: float
    committed: float | None  # the file's jobs now
    committed_with_job: float | None  # the same with the job's plan
    remaining_after: float | None  # epsilon - committed_with_job (negative: refused)
    fits: bool


def plan_fit(
    events: GroupEvents, epsilon_budget: float, delta: float, privacy_event: PrivacyEvent
) -> PlanFit:
    """Whether a job with ``privacy_event`` would fit the budget now (what :func:`reserve`
    checks), with the numbers around it."""
    try:
        committed = _totals(events, delta)[1]
        with_job = _totals(events, delta, privacy_event)[1]
    finally:
        trim_if_big()
    return PlanFit(
        epsilon=epsilon_budget,
        delta=delta,
        committed=_finite(committed),
        committed_with_job=_finite(with_job),
        remaining_after=epsilon_budget - with_job if math.isfinite(with_job) else None,
        fits=with_job <= epsilon_budget,
    )


# -- a group's budget -------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetChange:
    """A budget as it was and as it is after a change (``None``: no budget)."""

    before: tuple[float | None, float | None]
    after: tuple[float, float]


def change_budget(
    session: Session, group: BudgetGroup, epsilon_budget: float | None, delta: float | None
) -> BudgetChange:
    """Set or change a group's budget (``group`` locked): a value not given keeps the current
    one (ε is needed when the group has none; δ defaults to 1/N^1.1 rounded down, N the
    group's distinct examples, or its users (:func:`group_units`); δ ≤ 1/N). Refused
    (:class:`Conflict`, the transaction rolled back) if what is already committed does not
    fit the new budget."""
    before = (group.epsilon_budget, group.delta)
    eps = epsilon_budget if epsilon_budget is not None else group.epsilon_budget
    if eps is None:
        raise InvalidInput(
            "this data set has no budget: epsilon_budget is needed",
            param="epsilon_budget",
            code="invalid_value",
        )
    d = delta if delta is not None else group.delta
    eps_b, d = budget_values(group_units(session, group), eps, d)
    assert eps_b is not None and d is not None
    group.epsilon_budget, group.delta = eps_b, d
    _spent, committed = settle(session, group)
    if committed > eps_b:
        session.rollback()
        raise Conflict(
            f"the jobs of data set {group.id} already commit epsilon={committed:.4g} at "
            f"delta={d:g}, above the requested budget {eps_b:g}",
            param="epsilon_budget",
            code="budget_exceeded",
        )
    return BudgetChange(before=before, after=(eps_b, d))


@dataclass(frozen=True)
class Budget:
    """ε's at the budget's δ (``None``: no finite bound). ``reserved = committed − spent`` and
    ``remaining = epsilon − committed`` are differences of composed ε's (ε's do not add)."""

    epsilon: float
    delta: float
    spent: float | None
    reserved: float | None
    committed: float | None
    remaining: float
    unit: str = "example"  # what each ε protects: one example, or one user (all its lines)


def group_budget(group: BudgetGroup, live: float | None = None) -> Budget | None:
    """The budget a group shows (None: it has none); ``live`` (:func:`live_spent`, up to
    SPENT_REFRESH_SECONDS old) raises the stored ``spent``, which is refreshed only when a job
    is created or ends: spent only grows, so the larger of the two is the fresher (a job that
    ended after the live value was composed shows what it spent, never the older 0)."""
    if group.epsilon_budget is None or group.delta is None:
        return None
    spent, committed = group.epsilon_spent, group.epsilon_committed
    if live is not None:
        spent = max(live, spent)
    return Budget(
        epsilon=group.epsilon_budget,
        delta=group.delta,
        spent=spent if math.isfinite(spent) else None,
        reserved=max(0.0, committed - spent) if math.isfinite(committed) else None,
        committed=committed if math.isfinite(committed) else None,
        remaining=max(0.0, group.epsilon_budget - committed),
        unit=group.privacy_unit or "example",
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class HistoryPoint:
    """The group's composed ε once its jobs up to and including ``job`` (in creation order;
    then its synthetic-data jobs' label histograms, in theirs) are counted."""

    job: Job | SyntheticJob
    job_epsilon_spent: float | None  # this job alone, at the group's δ
    spent: float | None
    committed: float | None


@dataclass(frozen=True)
class History:
    group_id: str
    delta: float  # the budget's δ (unbudgeted: the default 1/N^1.1)
    epsilon_budget: float | None
    points: list[HistoryPoint]


def history(session: Session, group: BudgetGroup) -> History:
    """The group's composed ε after each of its jobs, in creation order: at job i, the
    composition (:func:`compose`, never a sum) of the spent and committed events of jobs
    1..i."""
    try:
        return _history(session, group)
    finally:
        trim_if_big()


def _history(session: Session, group: BudgetGroup) -> History:
    delta = group_delta(session, group)
    spent: list[PrivacyEvent | None] = []
    committed: list[PrivacyEvent | None] = []
    points: list[HistoryPoint] = []
    for job in group_jobs(session, group.id):
        own = spent_event(job)
        spent.append(own)
        committed.append(committed_event(job))
        points.append(
            HistoryPoint(
                job=job,
                job_epsilon_spent=_finite(_compose([own], delta)),
                spent=_finite(_compose(spent, delta)),
                committed=_finite(_compose(committed, delta)),
            )
        )
    for release in group_releases(session, group.id):
        own = release_spent(release)
        spent.append(own)
        committed.append(release_committed(release))
        points.append(
            HistoryPoint(
                job=release,
                job_epsilon_spent=_finite(_compose([own], delta)),
                spent=_finite(_compose(spent, delta)),
                committed=_finite(_compose(committed, delta)),
            )
        )
    return History(
        group_id=group.id, delta=delta, epsilon_budget=group.epsilon_budget, points=points
    )
