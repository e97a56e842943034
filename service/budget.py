"""Privacy budgets of data sets: the privacy events of a job and their composition.

A file with a budget (ε_B, δ_B) accepts a job only if the composition of every job's
*committed* event stays within ε_B at δ_B. A job commits its whole planned event while it is
active — that is its reservation — and the event of the steps that actually ran once it has
ended (its settlement, :func:`settle`; which statuses are active is
:mod:`service.job_status`'s). The budget check composes all of them with the PLD accountant
under a lock on the file row; ε's are never added. The composition is incremental
(:func:`dprc_core.accounting.history.epsilon_for_history`): a file's events keep their jobs'
creation order, with an empty slot for a job without an event, so a new job, a job's progress
or its end recomposes O(log n) cached blocks instead of the whole history.

Every budget rule is here: the events a job commits, the totals of a file, the settlement a
job's end triggers, the optimistic snapshot job creation composes outside the locks, the
reservation (or refusal) of a new job, a budget's values and its change, the numbers a file
shows and its history, and a plan's preview against the budget.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyEvent, SubsampledGaussianEvent
from dprc_core.accounting.history import epsilon_for_history
from dprc_core.training.plan import check_delta_for_size, default_delta
from service.errors import Conflict, InvalidInput
from service.job_status import ACTIVE, JobStatus
from service.tables import File, Job


def nu_dpftrl_event(sigma: float, steps: int, noise: dict[str, Any]) -> PrivacyEvent:
    """The first ``steps`` steps of a ν-DP-FTRL job: rows 1..steps of its Toeplitz noise, at most
    ⌈steps / steps_per_epoch⌉ participations per example."""
    return PrivacyEvent.nu_dpftrl_prefix(
        sigma, steps, float(noise["nu"]), int(noise["min_separation"]), noise.get("bands")
    )


def _event(job: Job, steps: int) -> PrivacyEvent | None:
    if steps <= 0:
        return None
    noise = (job.privacy or {}).get("noise") or {}
    if noise.get("mechanism") == "nu_dpftrl":
        return nu_dpftrl_event(job.noise_multiplier, steps, noise)
    return SubsampledGaussianEvent(
        noise_multiplier=job.noise_multiplier,
        sample_rate=job.sample_rate,
        steps=steps,
        envelope=job.accounting_envelope,
        k=job.accounting_k,
        sketch=job.accounting_sketch,
    )


def planned_event(job: Job) -> PrivacyEvent:
    event = _event(job, job.steps_total)
    assert event is not None
    return event


def spent_event(job: Job) -> PrivacyEvent | None:
    """The steps that ran (the worker counts a step as soon as it starts)."""
    return _event(job, job.steps_done)


def compose(events: Sequence[PrivacyEvent | None], delta: float) -> float:
    """ε of the composition of ``events`` (slots in the file's job order, ``None`` for a job
    without an event); +inf (fits no budget) when the accountant cannot bound it. Incremental
    across calls (:func:`epsilon_for_history`): keep a job in its slot from call to call."""
    try:
        return epsilon_for_history(events, delta)
    except ValueError:
        return math.inf


# The file's ``spent`` as its jobs run: the stored value is refreshed when a job is created,
# ends or the budget changes; a read composes the steps that ran so far instead, at most once
# every SPENT_REFRESH_SECONDS per file (a running job's slot changes with every step; each
# change recomposes O(log n) blocks of the file's history).
SPENT_REFRESH_SECONDS = 2.0
_LIVE_MAX = 4096
_live: OrderedDict[str, tuple[float, tuple[PrivacyEvent | None, ...], float]] = OrderedDict()
_live_guard = threading.Lock()


def live_spent(session: Session, file: File) -> float:
    """ε spent on a budgeted file now, at its δ: the composition of the events of the steps
    each of its jobs has run (a running job's ``steps_done`` so far), as the settlement
    composes them; at most SPENT_REFRESH_SECONDS old."""
    if file.delta is None:
        return 0.0
    t = time.monotonic()
    with _live_guard:
        hit = _live.get(file.id)
    if hit is not None and t - hit[0] < SPENT_REFRESH_SECONDS:
        return hit[2]
    events = tuple(spent_event(j) for j in file_jobs(session, file.id))
    if hit is not None and hit[1] == events:
        value = hit[2]
    else:
        value = compose(list(events), file.delta)
    with _live_guard:
        _live[file.id] = (t, events, value)
        _live.move_to_end(file.id)
        while len(_live) > _LIVE_MAX:
            _live.popitem(last=False)
    return value


def lock_file(session: Session, file_id: str, tenant_id: int | None = None) -> File | None:
    """The file (of ``tenant_id`` when given, not deleted), its row locked for the rest of the
    transaction (FOR UPDATE on PostgreSQL; on SQLite the caller's transaction began with
    BEGIN IMMEDIATE, see :func:`service.db.locked_session`)."""
    query = select(File).where(File.id == file_id)
    if tenant_id is not None:
        query = query.where(File.tenant_id == tenant_id, File.deleted.is_(False))
    return session.scalar(query.with_for_update())


def file_jobs(session: Session, file_id: str) -> list[Job]:
    """The file's jobs in creation order (the slots of its budget's history)."""
    query = select(Job).where(Job.training_file_id == file_id).order_by(Job.seq)
    return list(session.scalars(query))


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


FileEvents = tuple[tuple[PrivacyEvent | None, ...], tuple[PrivacyEvent | None, ...]]
# a file's events and their totals with a new job's event, composed under no lock
Snapshot = tuple[FileEvents, tuple[float, float]] | None


def file_events(session: Session, file: File) -> FileEvents:
    """(spent, committed) events of a file's jobs, one slot per job in creation order (``None``
    for a job without such an event): what its budget composes. Equal snapshots compose to
    equal ε (the optimistic check of job creation), and a job keeps its slot, so composing a
    changed snapshot reuses the blocks that did not change (:func:`compose`)."""
    jobs = file_jobs(session, file.id)
    return (
        tuple(spent_event(j) for j in jobs),
        tuple(committed_event(j) for j in jobs),
    )


def totals(
    events: FileEvents, delta: float, extra: PrivacyEvent | None = None
) -> tuple[float, float]:
    """(spent, committed) composed ε of a file's events at δ, ``extra`` counted as committed in
    the slot after the file's jobs (where a job being created will be). Pure, and incremental
    through :func:`compose`: a state composed before costs a cache lookup, one more job
    O(log n) block compositions."""
    spent, committed = events
    return (
        compose(list(spent), delta),
        compose([*committed, extra] if extra is not None else list(committed), delta),
    )


def settle(
    session: Session,
    file: File,
    extra: PrivacyEvent | None = None,
    known: Snapshot = None,
) -> tuple[float, float]:
    """Recompute (spent, committed) ε of a budgeted file at its δ, with ``extra`` (a job about
    to be created) counted as committed; stores them on the row. Call under the file's lock.
    ``known``: a snapshot of the file's events and its totals computed outside the lock; used
    as is when the file's events are still those (no composition under the lock)."""
    if file.delta is None:
        return 0.0, 0.0
    events = file_events(session, file)
    if known is not None and known[0] == events:
        spent, committed = known[1]
    else:
        spent, committed = totals(events, file.delta, extra)
    file.epsilon_spent = spent
    file.epsilon_committed = committed
    return spent, committed


# -- a new job against its file's budget -----------------------------------------------------


def snapshot(events: FileEvents, delta: float, privacy_event: PrivacyEvent) -> Snapshot:
    """``events`` with their totals with ``privacy_event``, composed under no lock (the totals
    without it too: they warm the cache for a refusal's message)."""
    totals(events, delta)
    return events, totals(events, delta, privacy_event)


def changed_events(session: Session, file: File, known: Snapshot) -> FileEvents | None:
    """The file's events when they differ from the snapshot ``known`` (another job changed
    the file since), else None; an unbudgeted file never changes its budget."""
    if file.epsilon_budget is None or file.delta is None:
        return None
    events = file_events(session, file)
    if known is None or known[0] != events:
        return events
    return None


def reserve(
    session: Session,
    file: File,
    privacy_event: PrivacyEvent,
    known: Snapshot,
    planned_epsilon: float,
    target_delta: float,
) -> None:
    """Refuse the job whose planned event is ``privacy_event`` (planned ε ``planned_epsilon`` at
    its δ ``target_delta``) if the composed ε of the file's events with it exceeds the file's
    budget (never a sum of ε's); else store the new totals. Call under the file's lock."""
    if file.epsilon_budget is None or file.delta is None:
        return
    spent, committed = settle(session, file, extra=privacy_event, known=known)
    if committed <= file.epsilon_budget:
        return
    _before, current = totals(file_events(session, file), file.delta)
    session.rollback()
    remaining = max(0.0, file.epsilon_budget - current)
    raise Conflict(
        f"privacy budget of file {file.id} exceeded: budget epsilon="
        f"{file.epsilon_budget:g} at delta={file.delta:g}; already committed "
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
    events: FileEvents, epsilon_budget: float, delta: float, privacy_event: PrivacyEvent
) -> PlanFit:
    """Whether a job with ``privacy_event`` would fit the budget now (what :func:`reserve`
    checks), with the numbers around it."""
    committed = totals(events, delta)[1]
    with_job = totals(events, delta, privacy_event)[1]
    return PlanFit(
        epsilon=epsilon_budget,
        delta=delta,
        committed=_finite(committed),
        committed_with_job=_finite(with_job),
        remaining_after=epsilon_budget - with_job if math.isfinite(with_job) else None,
        fits=with_job <= epsilon_budget,
    )


# -- a file's budget --------------------------------------------------------------------------


def change_budget(session: Session, file: File, epsilon_budget: float, delta: float | None) -> None:
    """Set or change a data set's budget (``file`` locked); refused (:class:`Conflict`, the
    transaction rolled back) if what is already committed does not fit the new one."""
    assert file.n_examples is not None
    eps_b, d = budget_values(file.n_examples, epsilon_budget, delta)
    assert eps_b is not None and d is not None
    old = (file.epsilon_budget, file.delta)
    file.epsilon_budget, file.delta = eps_b, d
    _spent, committed = settle(session, file)
    if committed > eps_b:
        file.epsilon_budget, file.delta = old
        session.rollback()
        raise Conflict(
            f"the jobs on this file already commit epsilon={committed:.4g} at "
            f"delta={d:g}, above the requested budget {eps_b:g}",
            param="epsilon_budget",
            code="budget_exceeded",
        )


@dataclass(frozen=True)
class FileBudget:
    """ε's at the budget's δ (``None``: no finite bound). ``reserved = committed − spent`` and
    ``remaining = epsilon − committed`` are differences of composed ε's (ε's do not add)."""

    epsilon: float
    delta: float
    spent: float | None
    reserved: float | None
    committed: float | None
    remaining: float


def file_budget(file: File, live: float | None = None) -> FileBudget | None:
    """The budget a file shows (None: it has none); ``live`` (:func:`live_spent`) replaces the
    stored ``spent``, which is refreshed only when a job is created or ends."""
    if file.epsilon_budget is None or file.delta is None:
        return None
    spent, committed = file.epsilon_spent, file.epsilon_committed
    if live is not None:
        spent = live
    return FileBudget(
        epsilon=file.epsilon_budget,
        delta=file.delta,
        spent=spent if math.isfinite(spent) else None,
        reserved=max(0.0, committed - spent) if math.isfinite(committed) else None,
        committed=committed if math.isfinite(committed) else None,
        remaining=max(0.0, file.epsilon_budget - committed),
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class HistoryPoint:
    """The file's composed ε once its jobs up to and including ``job`` (in creation order)
    are counted."""

    job: Job
    job_epsilon_spent: float | None  # this job alone, at the file's δ
    spent: float | None
    committed: float | None


@dataclass(frozen=True)
class History:
    file_id: str
    delta: float  # the budget's δ (unbudgeted: the default 1/N^1.1)
    epsilon_budget: float | None
    points: list[HistoryPoint]


def history(session: Session, file: File) -> History:
    """The file's composed ε after each of its jobs, in creation order: at job i, the
    composition (:func:`compose`, never a sum) of the spent and committed events of jobs
    1..i. ``file`` is a fine-tune data set (``n_examples`` known)."""
    assert file.n_examples is not None
    delta = file.delta if file.delta is not None else default_delta(file.n_examples)
    jobs = sorted(file_jobs(session, file.id), key=lambda j: j.seq)  # creation order
    spent: list[PrivacyEvent | None] = []
    committed: list[PrivacyEvent | None] = []
    points: list[HistoryPoint] = []
    for job in jobs:
        own = spent_event(job)
        spent.append(own)
        committed.append(committed_event(job))
        points.append(
            HistoryPoint(
                job=job,
                job_epsilon_spent=_finite(compose([own], delta)),
                spent=_finite(compose(spent, delta)),
                committed=_finite(compose(committed, delta)),
            )
        )
    return History(file_id=file.id, delta=delta, epsilon_budget=file.epsilon_budget, points=points)
