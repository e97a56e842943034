"""Where file contents live: one folder per tenant under ``DPRC_DATA_DIR/files``, written
atomically; worker-produced archives are registered as the tenant's result files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.ids import new_id
from service.store.store import Store
from service.store.tables import File

RESULT_PURPOSE = "fine-tune-results"


def clean_filename(name: str | None) -> str:
    base = os.path.basename((name or "upload.jsonl").replace("\\", "/"))
    base = "".join(ch for ch in base if ch.isprintable() and ch != "\x00")[:255]
    return base or "upload.jsonl"


def storage_dir(store: Store, tenant_id: int) -> Path:
    path = store.settings.files_dir / str(tenant_id)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(directory: Path, name: str, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        target = directory / name
        os.replace(tmp, target)
        return target
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store_result_file(
    session: Session, store: Store, tenant_id: int, source: Path, filename: str
) -> File:
    """Register a worker-produced archive (e.g. a checkpoint) as a tenant's file. The caller
    commits."""
    file_id = new_id("file")
    directory = storage_dir(store, tenant_id)
    target = directory / f"{file_id}{''.join(source.suffixes)[-16:]}"
    os.replace(source, target)
    row = File(
        id=file_id,
        tenant_id=tenant_id,
        filename=clean_filename(filename),
        purpose=RESULT_PURPOSE,
        bytes=target.stat().st_size,
        created_at=now(),
        storage_path=str(target),
        deleted=False,
    )
    session.add(row)
    session.flush()
    return row
