"""Privacy budgets of data sets: the privacy events of a job and their composition.

A file with a budget (ε_B, δ_B) accepts a job only if the composition of every job's
*committed* event stays within ε_B at δ_B. A job commits its whole planned event while it is
active — that is its reservation — and the event of the steps that actually ran once it has
ended (its settlement; which statuses hold a reservation is the lifecycle's rule, see
:func:`service.lifecycle.settle`). The budget check composes all of them with the PLD
accountant under a lock on the file row; ε's are never added. The composition is incremental
(:func:`dprc_core.accounting.history.epsilon_for_history`): a file's events keep their jobs'
creation order, with an empty slot for a job without an event, so a new job, a job's progress
or its end recomposes O(log n) cached blocks instead of the whole history.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyEvent
from dprc_core.accounting.history import epsilon_for_history
from dprc_core.training.plan import check_delta_for_size
from service.errors import InvalidInput
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
    return PrivacyEvent(
        noise_multiplier=job.noise_multiplier,
        sample_rate=job.sample_rate,
        steps=steps,
        clipping=job.accounting_clipping,
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
