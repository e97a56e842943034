"""Retention of a finished job's checkpoints (``DPRC_KEEP_CHECKPOINTS=K``): the last K
checkpoints stay (the final one always: it is the fine-tuned model), the older ones' archives
are deleted as files are (the row kept, ``deleted: true``, the bytes removed) and their folders
in the job's private run folder removed. The job's ledger, its events (each checkpoint's ε and
metrics among them), the budgets and the audit log are never touched. Idempotent: a run cut
short is completed by the next one."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from dprc_core.training.checkpoint import checkpoint_dir
from service.base.clock import now
from service.data.private_data import run_folder
from service.store.store import Store
from service.store.tables import Checkpoint, File

log = logging.getLogger(__name__)


def retire_old_checkpoints(session: Session, keep: int | None, job_id: str) -> list[int]:
    """Mark the archives of an ended job's checkpoints beyond the last ``keep`` deleted, in
    ``session``'s transaction (the one that ends the job: no reader sees the job ended with
    checkpoints about to go); the steps retired. Their bytes go with
    :func:`remove_retired_checkpoints` after the commit."""
    if keep is None:
        return []
    ckpts = list(
        session.scalars(
            select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
        )
    )
    old = ckpts[: max(0, len(ckpts) - keep)]
    for ckpt in old:
        archive = session.scalar(select(File).where(File.id == ckpt.file_id))
        if archive is not None and not archive.deleted:
            archive.deleted, archive.deleted_at = True, now()
    return [c.step for c in old]


def remove_retired_checkpoints(store: Store, job_id: str) -> None:
    """Remove the bytes of an ended job's retired checkpoints (archives marked deleted, and
    their folders in the run folder). Idempotent: a run cut short is completed by the next."""
    keep = store.settings.keep_checkpoints
    if keep is None:
        return
    with store.sessions() as session:
        ckpts = list(
            session.scalars(
                select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
            )
        )
        old = ckpts[: max(0, len(ckpts) - keep)]
        paths = [
            Path(a.storage_path)
            for a in session.scalars(
                select(File).where(File.id.in_([c.file_id for c in old]), File.deleted.is_(True))
            )
        ]
    run = run_folder(store.settings.data_dir, job_id)
    for path in paths:
        path.unlink(missing_ok=True)
    for ckpt in old:
        shutil.rmtree(checkpoint_dir(run, ckpt.step), ignore_errors=True)
    if old:
        log.info("job %s: kept the last %d checkpoints, removed %d", job_id, keep, len(old))
