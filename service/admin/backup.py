"""``dprc admin backup DIR``: the privacy record in a folder — the database (SQLite's online
backup API, or ``pg_dump``: :mod:`service.admin.database_copy`), the job ledgers
(:mod:`service.jobs.ledger_files`), the tenants' example-hash keys, and a manifest with the time,
the database's kind and Alembic revision, the data volume's id and a SHA-256 of every file
(:mod:`service.admin.backup_manifest`). It runs while the server runs.

Not in a backup: uploaded data, checkpoints and their archives, results, run folders (private
working state), the run secret. They are not the privacy record: a lost upload cannot be
trained on again, a lost checkpoint is a lost model, never a forgotten charge. Back the data
volume up with them if they matter (docs/operations.md, "Backups").

The data volume's id (``DATA_DIR/volume-id``, made at the first backup) tells a restore
whether the data volume it finds is the one the backup was taken from: only then do its
ledgers tell which jobs ran after the backup (:mod:`service.admin.restore`).
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from service.admin import backup_manifest as bm
from service.admin import database_copy as dbcopy
from service.data.example_hashes import SECRETS_DIR
from service.jobs.ledger_files import ledger_files
from service.store.db import is_sqlite
from service.store.ledger_folder import LEDGERS_DIR, SINCE_FILE, ledgers_dir, write_atomic
from service.store.store import Store

VOLUME_ID = "volume-id"
DATABASE_DIR = "database"
SQLITE_FILE = "dprc.sqlite3"
PG_FILE = "dprc.pgdump"
TENANT_KEYS = "tenant-*.key"


def volume_id(data_dir: Path, create: bool = False) -> str | None:
    """The data volume's id; made (a random UUID) when ``create`` and missing."""
    path = data_dir / VOLUME_ID
    if path.is_file():
        return path.read_text().strip() or None
    if not create:
        return None
    value = str(uuid.uuid4())
    data_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, f"{value}\n".encode())
    return value


def _empty_target(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} exists and is not an empty folder: back up into a new one")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    dest.chmod(0o700)


def backup(store: Store, dest: Path) -> bm.Manifest:
    """Write a backup of ``store``'s privacy record into the new (or empty) folder ``dest``;
    its manifest. A failure leaves ``dest`` empty."""
    _empty_target(dest)
    try:
        return _backup(store, dest)
    except BaseException:
        for child in dest.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        raise


def _backup(store: Store, dest: Path) -> bm.Manifest:
    settings = store.settings
    data_dir = settings.data_dir
    vid = volume_id(data_dir, create=True)
    assert vid is not None
    created_at = time.time()  # before the snapshot: later activity is "after the backup"
    if is_sqlite(store.engine):
        db_file = f"{DATABASE_DIR}/{SQLITE_FILE}"
        source = store.engine.url.database
        assert source is not None
        snap = dbcopy.sqlite_backup(Path(source), dest / db_file)
        kind = "sqlite"
    else:
        db_file = f"{DATABASE_DIR}/{PG_FILE}"
        snap = dbcopy.pg_backup(store.engine, settings.sqlalchemy_url, dest / db_file)
        kind = "postgresql"
    names = [db_file]
    # the ledgers after the snapshot: each file is whole (written by rename), at least as new
    ledgers = ledgers_dir(data_dir)
    to_copy = [*ledger_files(data_dir), ledgers / SINCE_FILE]
    names += _copy_into(dest, LEDGERS_DIR, [p for p in to_copy if p.is_file()])
    keys = sorted((data_dir / SECRETS_DIR).glob(TENANT_KEYS))
    names += _copy_into(dest, SECRETS_DIR, keys)
    manifest = bm.Manifest(
        created_at=created_at,
        database_kind=kind,
        database_file=db_file,
        alembic_revision=snap.revision,
        volume_id=vid,
        jobs=snap.jobs,
        groups=snap.groups,
        files={name: bm.sha256_of(dest / name) for name in names},
    )
    bm.write(dest, manifest)
    return manifest


def _copy_into(dest: Path, folder: str, files: list[Path]) -> list[str]:
    if not files:
        return []
    (dest / folder).mkdir(mode=0o700, exist_ok=True)
    names = []
    for path in files:
        shutil.copyfile(path, dest / folder / path.name)
        names.append(f"{folder}/{path.name}")
    return names
