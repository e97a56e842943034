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

from dprc_core.training.checkpoint import checkpoint_dir
from service.clock import now
from service.db import locked_session
from service.private_data import run_folder
from service.store import Store
from service.tables import Checkpoint, File

log = logging.getLogger(__name__)


def keep_last_checkpoints(store: Store, job_id: str) -> list[int]:
    """Apply ``store.settings.keep_checkpoints`` to an ended job; the steps whose checkpoints
    were removed (none when the setting is off)."""
    keep = store.settings.keep_checkpoints
    if keep is None:
        return []
    with locked_session(store.sessions) as session:
        ckpts = list(
            session.scalars(
                select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
            )
        )
        old = ckpts[: max(0, len(ckpts) - keep)]
        paths: list[Path] = []
        for ckpt in old:
            archive = session.scalar(select(File).where(File.id == ckpt.file_id))
            if archive is not None and not archive.deleted:
                archive.deleted, archive.deleted_at = True, now()
                paths.append(Path(archive.storage_path))
        session.commit()
    run = run_folder(store.settings.data_dir, job_id)
    for path in paths:
        path.unlink(missing_ok=True)
    for ckpt in old:
        shutil.rmtree(checkpoint_dir(run, ckpt.step), ignore_errors=True)
    if old:
        log.info("job %s: kept the last %d checkpoints, removed %d", job_id, keep, len(old))
    return [c.step for c in old]
