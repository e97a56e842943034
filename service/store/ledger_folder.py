"""The folder of the job ledgers on the data volume, ``DATA_DIR/ledgers/`` (made at the store's
opening, with ``SINCE``: when ledger files began to be kept), and the atomic write its files
use. The ledgers themselves: :mod:`service.jobs.ledger_files`."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

LEDGERS_DIR = "ledgers"
SINCE_FILE = "SINCE"


def ledgers_dir(data_dir: Path) -> Path:
    return data_dir / LEDGERS_DIR


def ledger_path(data_dir: Path, job_id: str) -> Path:
    return ledgers_dir(data_dir) / f"{job_id}.json"


def since(data_dir: Path) -> int | None:
    """When the ledgers folder was made (None: it was not)."""
    try:
        return int((ledgers_dir(data_dir) / SINCE_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def ensure_dir(data_dir: Path) -> Path:
    """The ledgers folder, made (0700, with its ``SINCE``) if missing."""
    folder = ledgers_dir(data_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    marker = folder / SINCE_FILE
    if not marker.exists():
        write_atomic(marker, f"{int(time.time())}\n".encode())
    return folder


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` in ``path``: a temporary file in the same folder, fsynced, renamed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
