"""A backup's ``manifest.json``: when it was taken, of which database (kind, Alembic
revision), the data volume it came from, the jobs and budget groups the database held at that
moment, and the SHA-256 of every file of the backup. Its own ``digest`` (SHA-256 of the rest,
canonical JSON) shows an edit of the manifest itself; :func:`verify` checks both before a
restore touches anything.

A backup folder::

    manifest.json
    database/dprc.sqlite3            SQLite (the online backup API), or
    database/dprc.pgdump             PostgreSQL (pg_dump --format=custom)
    ledgers/SINCE, ledgers/<job>.json  the job ledgers (service/jobs/ledger_files.py)
    secrets/tenant-<id>.key          the tenants' example-hash keys (service/data/example_hashes.py)
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT = "dprc-backup"
VERSION = 1
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class JobAtBackup:
    """A job as the backed-up database held it."""

    tenant_id: int
    budget_group: str | None
    status: str
    steps_done: int


@dataclass
class Manifest:
    created_at: float  # unix seconds: taken before the database's snapshot
    database_kind: str  # sqlite | postgresql
    database_file: str  # path in the backup folder
    alembic_revision: str
    volume_id: str  # the data volume's id (DATA_DIR/volume-id)
    jobs: dict[str, JobAtBackup] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)  # budget group -> tenant
    files: dict[str, str] = field(default_factory=dict)  # path in the backup -> sha256

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "created_at": self.created_at,
            "created_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at)),
            "database": {
                "kind": self.database_kind,
                "file": self.database_file,
                "alembic_revision": self.alembic_revision,
            },
            "volume_id": self.volume_id,
            "jobs": {
                k: {
                    "tenant_id": j.tenant_id,
                    "budget_group": j.budget_group,
                    "status": j.status,
                    "steps_done": j.steps_done,
                }
                for k, j in sorted(self.jobs.items())
            },
            "budget_groups": {k: {"tenant_id": v} for k, v in sorted(self.groups.items())},
            "files": {k: {"sha256": v} for k, v in sorted(self.files.items())},
        }
        body["digest"] = hashlib.sha256(_canonical(body)).hexdigest()
        return body

    @property
    def created_at_utc(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at))


def write(folder: Path, manifest: Manifest) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True))


class BackupRefused(ValueError):
    """A backup folder that must not be restored (one line saying why)."""


def _parse(body: Any) -> Manifest:
    try:
        db = body["database"]
        return Manifest(
            created_at=float(body["created_at"]),
            database_kind=str(db["kind"]),
            database_file=str(db["file"]),
            alembic_revision=str(db["alembic_revision"]),
            volume_id=str(body["volume_id"]),
            jobs={
                k: JobAtBackup(
                    int(v["tenant_id"]), v["budget_group"], str(v["status"]), int(v["steps_done"])
                )
                for k, v in body["jobs"].items()
            },
            groups={k: int(v["tenant_id"]) for k, v in body["budget_groups"].items()},
            files={k: str(v["sha256"]) for k, v in body["files"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BackupRefused(f"{MANIFEST} is not a dprc backup manifest ({exc!r})") from None


def verify(folder: Path) -> Manifest:
    """The manifest of the backup in ``folder`` once every check holds: its own digest, every
    listed file present with its SHA-256, no file that it does not list. Else
    :class:`BackupRefused` naming the first file that does not hold."""
    path = folder / MANIFEST
    if not path.is_file():
        raise BackupRefused(f"{folder} holds no {MANIFEST}: not a dprc backup")
    try:
        body = json.loads(path.read_text())
    except ValueError as exc:
        raise BackupRefused(f"{MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise BackupRefused(f"{MANIFEST} is not a dprc backup manifest")
    if body.get("version") != VERSION:
        raise BackupRefused(f"{MANIFEST}: unsupported version {body.get('version')!r}")
    stated = body.pop("digest", None)
    if stated != hashlib.sha256(_canonical(body)).hexdigest():
        raise BackupRefused(f"{MANIFEST} was changed after the backup (its digest does not match)")
    manifest = _parse(body)
    for name, expected in sorted(manifest.files.items()):
        file = folder / name
        outside = ".." in Path(name).parts or Path(name).is_absolute()
        if outside or file.is_symlink() or not file.is_file():
            raise BackupRefused(f"{name}: listed in {MANIFEST} but missing from the backup")
        if sha256_of(file) != expected:
            raise BackupRefused(f"{name}: checksum mismatch (the file changed after the backup)")
    present = {
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()
    }
    extra = sorted(present - set(manifest.files) - {MANIFEST})
    if extra:
        raise BackupRefused(f"{extra[0]}: in the backup folder but not in {MANIFEST}")
    if manifest.database_file not in manifest.files:
        raise BackupRefused(f"{MANIFEST} lists no database file")
    return manifest
