"""Job ledgers on the data volume: ``DATA_DIR/ledgers/<job>.json``, one file per job that a
worker started, rewritten (atomically) whenever the job's record changes — its start, each
step's progress, its accounting, its end.

A ledger file repeats what the database holds of the job's privacy record: its tenant, its
training file and budget group, the steps that ran, their privacy events (the
``dprc-privacy-ledger`` JSON of :class:`dprc_core.accounting.PrivacyLedger`, as
``GET /v1/fine_tuning/jobs/{id}/ledger`` shows it) and the ε the worker reported. It is written
after the database's commit, never deleted (retention and file deletions leave it), and it is
outside the database, so that

* ``dprc admin check`` (:mod:`service.admin.consistency`) can compare each job's ledger with the
  database's charges, and
* ``dprc admin restore`` (:mod:`service.admin.restore`) can find the jobs that ran after the backup
  it restores — the ledgers the restored database does not know, or that hold more steps than
  it records — and freeze their data sets.

``ledgers/SINCE`` holds the time (unix seconds) the folder was made: jobs that started before
it ran before ledger files were kept and may have none.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from dprc_core.accounting import PrivacyLedger
from service.budget import budget
from service.store.ledger_folder import ensure_dir, ledger_path, ledgers_dir, write_atomic
from service.store.tables import File, Job

if TYPE_CHECKING:
    from service.store.store import Store

log = logging.getLogger(__name__)

FORMAT = "dprc-job-ledger"
VERSION = 1


def record_of(job: Job, group_id: str | None) -> dict[str, Any]:
    """The ledger file's content for ``job`` as the database holds it now."""
    spent = budget.spent_event(job)
    ledger = PrivacyLedger([spent] if spent is not None else [])
    return {
        "format": FORMAT,
        "version": VERSION,
        "job_id": job.id,
        "tenant_id": job.tenant_id,
        "training_file": job.training_file_id,
        "budget_group": group_id,
        "status": job.status,
        "started_at": job.started_at,
        "updated_at": time.time(),
        "steps_total": job.steps_total,
        "steps_done": job.steps_done,
        "epsilon_spent": job.epsilon_spent,
        "delta": float((job.privacy or {}).get("target_delta", 0.0)),
        "ledger": json.loads(ledger.to_json()),
        "planned": budget.planned_event(job).to_dict(),
    }


def write_job_ledger(store: Store, job_id: str) -> None:
    """Rewrite the job's ledger file from the database (after a commit that changed its
    record). A failure is logged, never raised: the database stays the record of truth, and
    ``dprc admin check`` reports the file that disagrees."""
    try:
        with store.sessions() as session:
            row = session.execute(
                select(Job, File.group_id)
                .join(File, File.id == Job.training_file_id)
                .where(Job.id == job_id)
            ).one_or_none()
            if row is None:
                return
            job, group_id = row
            record = record_of(job, group_id)
        ensure_dir(store.settings.data_dir)
        data = json.dumps(record, sort_keys=True, indent=1).encode()
        write_atomic(ledger_path(store.settings.data_dir, job_id), data)
    except Exception:  # noqa: BLE001 - the job goes on; the check reports the file
        log.exception("could not write the ledger file of job %s", job_id)


def read(path: Path) -> dict[str, Any]:
    """A ledger file's content; ValueError when it is not one."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.name}: not readable JSON ({exc})") from exc
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise ValueError(f"{path.name}: not a job ledger (format must be {FORMAT!r})")
    if not isinstance(value.get("job_id"), str) or not isinstance(value.get("steps_done"), int):
        raise ValueError(f"{path.name}: job_id or steps_done missing")
    return value


def ledger_files(data_dir: Path) -> list[Path]:
    """The job ledger files of the data volume (subfolders, such as those a restore set aside,
    excluded)."""
    folder = ledgers_dir(data_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if p.is_file())


# the run folder's checkpoints (dprc_core/training/checkpoint.py's layout, read here without
# importing the library's engine): runs/<job>/checkpoints/step-NNNNNN/{ledger,metadata}.json
RUNS_DIR = "runs"
CHECKPOINTS_DIR = "checkpoints"


def checkpoint_ledgers(data_dir: Path, job_id: str) -> list[tuple[int, Path]]:
    """(step, checkpoint folder) of each complete checkpoint in the job's run folder, by
    step."""
    root = data_dir / RUNS_DIR / job_id / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for folder in root.glob("step-*"):
        step = folder.name.removeprefix("step-")
        if step.isdigit() and (folder / "metadata.json").is_file():
            found.append((int(step), folder))
    return sorted(found)


def run_folders(data_dir: Path) -> list[Path]:
    root = data_dir / RUNS_DIR
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def steps_of(ledger_json: dict[str, Any]) -> int:
    """The steps a ``dprc-privacy-ledger`` JSON object's events count."""
    events = ledger_json.get("events") or []
    return sum(int(e.get("steps", 0)) for e in events if isinstance(e, dict))
