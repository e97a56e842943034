"""``dprc admin check``: does the privacy record hold together?

* **Every job's ledger file** (:mod:`service.jobs.ledger_files`) agrees with the database: the same
  tenant, training file and budget group; for an ended job, the same steps, the same privacy
  events as the database charges (:func:`service.budget.budget.spent_event`) and the same ε (within
  :data:`EPSILON_TOLERANCE`); for an active job (charged its whole plan), no more steps than
  planned and the same planned event. A job that ran steps after ledger files were kept
  (``ledgers/SINCE``) must have one; a ledger file of a job the database does not know is a
  problem too.
* **Every checkpoint** in a job's run folder is at a step the database records as run, and
  its ledger counts that many steps.
* **Every hash row** (``example_hashes``, ``example_users``) names a data set of its own tenant:
  those tables have no foreign keys (migration 0017: at 10⁷ rows an upload, their checks were
  two thirds of PostgreSQL's recording), so this check stands in for them. A row whose data set
  is missing would let a copy of its example be placed as if new.
* **Every budgeted data set**: the composition of its jobs' committed events (recomputed,
  never a sum) is within its budget, ε_committed ≤ ε_B·(1 + 1e-9) + 1e-9, and the stored
  total agrees with the recomputed one within :data:`EPSILON_TOLERANCE`.

Frozen data sets are listed, not problems. The check reads only (no lock): run it on a quiet
server, since a job's ledger file is written right after its database commit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from dprc_core.accounting import PrivacyEvent
from service.budget import budget
from service.budget.freezes import GroupState, frozen_groups
from service.jobs.ledger_files import checkpoint_ledgers, ledger_files, read, steps_of
from service.store.job_status import TERMINAL, JobStatus
from service.store.ledger_folder import ledger_path, ledgers_dir, since
from service.store.store import Store
from service.store.tables import (
    BudgetGroup,
    ExampleHash,
    ExampleUser,
    File,
    Job,
    SyntheticJob,
)

# |ε in a ledger file − ε in the database|, and a stored total against its recomputation:
# relative, with an absolute floor (both are the same float arithmetic, so agreement is exact
# unless something changed a number)
EPSILON_TOLERANCE = 1e-6
BUDGET_SLACK = 1e-9  # ε_committed ≤ ε_B·(1 + BUDGET_SLACK) + BUDGET_SLACK


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= EPSILON_TOLERANCE * max(1.0, abs(a), abs(b))


@dataclass
class CheckReport:
    jobs: int = 0
    ledgers: int = 0
    groups: int = 0
    problems: list[str] = field(default_factory=list)
    frozen: list[GroupState] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(store: Store) -> CheckReport:
    data_dir = store.settings.data_dir
    report = CheckReport()
    kept_since = since(data_dir)
    with store.sessions() as session:
        rows = session.execute(
            select(Job, File.group_id).join(File, File.id == Job.training_file_id).order_by(Job.seq)
        ).all()
        known = set()
        for job, group_id in rows:
            report.jobs += 1
            known.add(job.id)
            report.problems += _job_problems(data_dir, job, group_id, kept_since)
        for row in session.scalars(select(SyntheticJob).order_by(SyntheticJob.seq)):
            report.jobs += 1
            known.add(row.id)
            report.problems += _synthetic_problems(data_dir, row)
        for path in ledger_files(data_dir):
            report.ledgers += 1
            if path.stem not in known:
                report.problems.append(
                    f"ledger {path.name}: job {path.stem} is not in the database (it ran "
                    f"{_steps_in(path)} steps that no budget records)"
                )
        for group in session.scalars(select(BudgetGroup).order_by(BudgetGroup.seq)):
            report.groups += 1
            report.problems += _group_problems(session, group)
        report.problems += _hash_row_problems(session)
        report.frozen = frozen_groups(session)
    return report


def _hash_row_problems(session: Any) -> list[str]:
    """Rows of the hash tables whose (tenant, data set) is not a data set of that tenant."""
    out = []
    for table in (ExampleHash, ExampleUser):
        owner = select(BudgetGroup.id).where(
            BudgetGroup.id == table.group_id, BudgetGroup.tenant_id == table.tenant_id
        )
        count, first = session.execute(
            select(func.count(), func.min(table.group_id)).where(~owner.exists())
        ).one()
        if count:
            out.append(
                f"{table.__tablename__}: {count} rows name a data set that their tenant does "
                f"not have (first: {first})"
            )
    return out


def _synthetic_problems(data_dir: Path, row: SyntheticJob) -> list[str]:
    """A synthetic-data job's ledger file counts its histogram's release as the database does
    (``steps_done``: 1 once drawn)."""
    path = ledger_path(data_dir, row.id)
    if not path.is_file():
        if row.steps_done:
            return [f"synthetic data job {row.id}: drew its label histogram but has no ledger"]
        return []
    try:
        steps = read(path)["steps_done"]
    except ValueError as exc:
        return [f"synthetic data job {row.id}: {exc}"]
    if steps != row.steps_done:
        return [
            f"synthetic data job {row.id}: its ledger counts {steps} releases, the database "
            f"{row.steps_done}"
        ]
    return []


def _steps_in(path: Path) -> str:
    try:
        return str(read(path)["steps_done"])
    except ValueError:
        return "an unknown number of"


def _job_problems(
    data_dir: Path, job: Job, group_id: str | None, kept_since: int | None
) -> list[str]:
    out = [f"job {job.id}: {p}" for p in _ledger_problems(data_dir, job, group_id, kept_since)]
    for step, folder in checkpoint_ledgers(data_dir, job.id):
        if step > job.steps_done:
            out.append(
                f"job {job.id}: checkpoint at step {step} beyond the {job.steps_done} steps the "
                "database records"
            )
        led = folder / "ledger.json"
        if led.is_file():
            try:
                counted = steps_of(json.loads(led.read_text()))
            except (ValueError, AttributeError):
                out.append(f"job {job.id}: its checkpoint ledger at step {step} is unreadable")
                continue
            if counted != step:
                out.append(
                    f"job {job.id}: the ledger of its checkpoint at step {step} counts {counted} "
                    "steps"
                )
    return out


def _ledger_problems(
    data_dir: Path, job: Job, group_id: str | None, kept_since: int | None
) -> list[str]:
    path = ledger_path(data_dir, job.id)
    if not path.is_file():
        if job.steps_done <= 0:
            return []
        if kept_since is None:
            return [f"ran {job.steps_done} steps; the data folder has no {ledgers_dir(data_dir)}"]
        if (job.started_at or 0) >= kept_since:
            return [f"ran {job.steps_done} steps but has no ledger file {path.name}"]
        return []  # it ran before ledger files were kept
    try:
        record = read(path)
    except ValueError as exc:
        return [str(exc)]
    where = f"ledger {path.name}"
    out = []
    for key, value in (
        ("tenant_id", job.tenant_id),
        ("training_file", job.training_file_id),
        ("budget_group", group_id),
    ):
        if record.get(key) != value:
            out.append(f"{where} says {key}={record.get(key)!r}, the database {value!r}")
    steps = record["steps_done"]
    events = (record.get("ledger") or {}).get("events")
    if not isinstance(events, list) or steps_of(record["ledger"]) != steps:
        out.append(f"{where}: its privacy events do not count its {steps} steps")
    if JobStatus(job.status) in TERMINAL:
        out += _ended_problems(where, job, record, steps, events)
    else:
        if steps > job.steps_total:
            out.append(f"{where}: {steps} steps, more than the {job.steps_total} planned")
        if not _same_events([record.get("planned")], [budget.planned_event(job)]):
            out.append(f"{where}: its planned event is not the one the database charges")
    return out


def _ended_problems(
    where: str, job: Job, record: dict[str, Any], steps: int, events: Any
) -> list[str]:
    """An ended job is charged the steps that ran: its ledger must say just that."""
    out = []
    if steps != job.steps_done:
        out.append(f"{where}: {steps} steps, the database charges {job.steps_done}")
    spent = budget.spent_event(job)
    if not _same_events(events, [spent] if spent is not None else []):
        out.append(f"{where}: its privacy events are not those the database charges")
    eps = record.get("epsilon_spent")
    if not isinstance(eps, int | float) or not _close(float(eps), job.epsilon_spent):
        out.append(f"{where}: epsilon_spent={eps!r}, the database {job.epsilon_spent!r}")
    return out


def _same_events(stored: Any, events: list[PrivacyEvent]) -> bool:
    """Whether a ledger file's event objects are ``events``, read as the database's are (a
    file written before the hidden-scale law was recorded omits it: the legacy law, as the
    database's event of that time reads)."""
    if not isinstance(stored, list) or len(stored) != len(events):
        return False
    try:
        return [PrivacyEvent.from_dict(d) for d in stored] == events
    except ValueError:
        return False


def _group_problems(session: Any, group: BudgetGroup) -> list[str]:
    if group.epsilon_budget is None or group.delta is None:
        return []
    _spent, committed = budget.totals(budget.group_events(session, group), group.delta)
    out = []
    limit = group.epsilon_budget * (1 + BUDGET_SLACK) + BUDGET_SLACK
    if not committed <= limit:
        out.append(
            f"data set {group.id}: its jobs commit epsilon={committed:.6g} at delta="
            f"{group.delta:g}, above its budget {group.epsilon_budget:g}"
        )
    if not _close(committed, group.epsilon_committed):
        out.append(
            f"data set {group.id}: stored committed epsilon={group.epsilon_committed:.6g}, "
            f"its jobs compose to {committed:.6g}"
        )
    return out


def report_lines(report: CheckReport) -> tuple[list[str], list[str]]:
    """(stdout lines: the problems, or one ``ok`` line; stderr lines: the frozen data sets)."""
    notes = [f"frozen: data set {g.id}: {g.frozen_reason}" for g in report.frozen]
    if report.problems:
        return list(report.problems), notes
    return [
        f"ok: {report.jobs} jobs, {report.ledgers} ledger files, {report.groups} data sets "
        f"({len(report.frozen)} frozen)"
    ], notes
