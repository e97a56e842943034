"""What the service keeps on disk that must stay private, and when it goes.

* **Modes.** Training files, the database, checkpoints and their resume state (which holds the
  engine's seed: whoever reads it can regenerate the noise) are readable by the service's user
  alone: :func:`restrict_new_files` sets the process umask to 077 (files 0600, folders 0700)
  in every process that writes them (``dprc serve``, the Celery workers) and closes the data
  folder to others. The library writes resume state 0600 itself (dprc_core/training/checkpoint).
* **Run folders** (``runs/<job>``: checkpoints with their resume state) are private working
  state, never served. A job's resume state is removed when the job ends — the released
  checkpoints stay, as the job's result files — and its whole run folder is removed when its
  training file is deleted (:func:`remove_run_folders`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def restrict_new_files(data_dir: Path) -> None:
    """Files this process creates from now on: 0600, folders 0700; the data folder 0700."""
    os.umask(PRIVATE_UMASK)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)


def run_folder(data_dir: Path, job_id: str) -> Path:
    """A job's private folder (checkpoints with their resume state); never served."""
    return data_dir / "runs" / job_id


def remove_resume_state(data_dir: Path, job_id: str) -> None:
    """The resume state of every checkpoint of an ended job (its seed and generator states);
    the checkpoints' released files stay until the job's data is removed."""
    checkpoints = run_folder(data_dir, job_id) / "checkpoints"
    if not checkpoints.is_dir():
        return
    for resume in checkpoints.glob("*/resume"):
        shutil.rmtree(resume, ignore_errors=True)
        if resume.exists():
            log.error("could not remove the resume state %s", resume)


def remove_run_folders(data_dir: Path, job_ids: Iterable[str]) -> None:
    for job_id in job_ids:
        shutil.rmtree(run_folder(data_dir, job_id), ignore_errors=True)
