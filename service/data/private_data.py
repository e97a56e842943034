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
* **Tokenized data** (``tokens/<tenant>/``: the stores of dprc_core/training/token_store.py,
  one per file content and tokenizer) is derived from a tenant's training files: a tenant's
  stores are its own folder, and deleting a file removes the stores built from its content
  (:func:`remove_token_stores`); a file of the same content left behind rebuilds its store.
* **The engine's seed** is not the job's ``seed`` (which the API returns): the worker derives
  it as HMAC-SHA256(the data folder's run secret, job seed) (:func:`engine_seed`), so whoever
  reads the job object cannot regenerate what the seed still drives (the sketches'
  projections; ν-DP-FTRL's noise and order, which secure mode does not cover). The run secret
  is ``secrets/run.key`` (0600), made once per data folder and shared by every worker on it.
"""

from __future__ import annotations

import hmac
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def restrict_new_files(data_dir: Path) -> None:
    """Files this process creates from now on: 0600, folders 0700; the data folder 0700."""
    os.umask(PRIVATE_UMASK)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)


def run_secret(data_dir: Path) -> bytes:
    """The data folder's 32-byte run secret, created (0600, exclusively) on first use."""
    path = data_dir / "secrets" / "run.key"
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another worker made it meanwhile
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
                f.flush()
                os.fsync(f.fileno())
    for _ in range(100):  # a concurrent creator may not have written it yet
        key = path.read_bytes()
        if len(key) == 32:
            return key
        time.sleep(0.01)
    raise RuntimeError(f"the run secret {path} is not 32 bytes long")


def engine_seed(data_dir: Path, job_seed: int) -> int:
    """The 63-bit seed the worker gives the engine for a job whose (API-visible) seed is
    ``job_seed``: a keyed hash, stable across the job's attempts."""
    digest = hmac.new(run_secret(data_dir), f"dprc/job-seed/{job_seed}".encode(), "sha256")
    return int.from_bytes(digest.digest()[:8], "little") >> 1


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


def token_store_dir(data_dir: Path, tenant_id: int) -> Path:
    """The tenant's tokenized stores (token_store.py), reused by its jobs on the same data."""
    return data_dir / "tokens" / str(tenant_id)


def remove_token_stores(data_dir: Path, tenant_id: int, file_path: Path) -> None:
    """Every store of the tenant built from a file of ``file_path``'s content (whatever the
    tokenizer); call it before the file's content is removed."""
    root = token_store_dir(data_dir, tenant_id)
    if not root.is_dir() or not file_path.exists():
        return
    from dprc_core.training.token_store import file_sha256, remove_stores_of

    remove_stores_of(root, file_sha256(file_path))
