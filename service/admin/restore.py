"""``dprc admin restore DIR``: the database and the privacy record back from a backup
(:mod:`service.admin.backup`), with the data sets whose spending the backup does not hold frozen.

Before anything changes, the restore checks the backup (every checksum, the manifest's own
digest: :func:`service.admin.backup_manifest.verify`), that the database is of the backup's kind,
and the Alembic revisions: a backup or a database migrated by a release newer than this one is
refused; an older backup is restored and then migrated to this release's head.

**Freezing.** Jobs that ran after the backup charged budgets that the restored database does
not hold: restoring would reopen those budgets. The data volume tells which ones — when it is
the volume the backup was taken from (``DATA_DIR/volume-id`` equals the manifest's): a ledger
file (:mod:`service.jobs.ledger_files`) of a job the backup does not know, or with more steps than
the backup records, or a checkpoint beyond them in a job's run folder. Each such job's budget
group is frozen (:mod:`service.budget.freezes`): no new job until an admin acknowledges it. Evidence
that names no known group (a run folder with no ledger, an unreadable ledger), a data volume
that is not the backed-up one (it was lost, or replaced), or ``freeze_all`` freezes **every**
group: the conservative default, since nothing then tells which budgets were spent.

**The data volume.** Ledger files that disagree with the restored database are moved aside to
``ledgers/restored-<time>/`` (kept, never deleted) and the backup's copies put in their place;
the tenants' example-hash keys come back from the backup (a different key is moved aside to
``secrets/restored-<time>/``); the volume takes the backup's id. Run folders, uploads and
checkpoints are left as they are.

**Never half-done.** The new database is prepared apart and swapped in at once: SQLite's is a
new file (restored, migrated, frozen) renamed over the old one, which is kept as
``<name>.before-restore-<time>``; PostgreSQL's dump and the freezes run in one ``psql``
transaction (:func:`service.admin.database_copy.pg_load`). The volume's files are staged before and
renamed after. Stop the API and the workers before a restore: a SQLite file renamed under a
running server is not the one it writes to, and PostgreSQL waits at most 30 s for their locks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from service.admin import backup_manifest as bm
from service.admin import database_copy as dbcopy
from service.admin.backup import VOLUME_ID, volume_id
from service.base.settings import Settings
from service.budget import freezes
from service.data.example_hashes import SECRETS_DIR
from service.jobs.ledger_files import checkpoint_ledgers, ledger_files, read, run_folders
from service.store.db import MIGRATIONS, make_engine, make_sessionmaker, upgrade
from service.store.ledger_folder import ledgers_dir, write_atomic
from service.store.tables import BudgetGroup

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

SET_ASIDE = "restored-{stamp}"
MAX_JOBS_IN_REASON = 3


@dataclass(frozen=True)
class Evidence:
    """A sign on the data volume that a job ran after the backup; ``group`` its budget group
    (None: nothing tells which)."""

    job_id: str
    group: str | None
    what: str


@dataclass
class RestoreReport:
    manifest: bm.Manifest
    frozen: dict[str, str] = field(default_factory=dict)  # group -> reason
    evidence: list[Evidence] = field(default_factory=list)
    unknown_groups: list[str] = field(default_factory=list)  # not in the backup: not frozen
    set_aside: list[Path] = field(default_factory=list)
    replaced_database: list[Path] = field(default_factory=list)
    migrated_from: str | None = None  # the backup's revision, when it was migrated
    same_volume: bool = True  # the data volume is the one the backup was taken from


# -- what the backup is, and whether this release can restore it -------------------------------


def _script() -> ScriptDirectory:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg)


def _current_revision(settings: Settings) -> str | None:
    """The target database's revision (None: empty, or a SQLite file not there yet)."""
    from alembic.runtime.migration import MigrationContext

    url = settings.sqlalchemy_url
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            return None
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def check_restorable(settings: Settings, manifest: bm.Manifest) -> bool:
    """Refuse (:class:`BackupRefused`) a backup this release cannot restore onto this
    database; True when it must be migrated after the restore."""
    kind = "sqlite" if settings.sqlalchemy_url.startswith("sqlite") else "postgresql"
    if manifest.database_kind != kind:
        raise bm.BackupRefused(
            f"the backup is of a {manifest.database_kind} database, the configured one is "
            f"{kind}: restore it onto a {manifest.database_kind} database"
        )
    script = _script()
    head = script.get_current_head()
    known = {rev.revision for rev in script.walk_revisions()}
    if manifest.alembic_revision not in known:
        raise bm.BackupRefused(
            f"the backup's database is at migration {manifest.alembic_revision!r}, which this "
            f"release (head {head}) does not know: restore it with the release that made it"
        )
    current = _current_revision(settings)
    if current is not None and current not in known:
        raise bm.BackupRefused(
            f"the configured database is at migration {current!r}, made by a newer release "
            f"than this one (head {head}): restore with that release"
        )
    return manifest.alembic_revision != head


# -- the evidence on the data volume -----------------------------------------------------------


def _backup_steps(folder: Path, manifest: bm.Manifest) -> dict[str, int]:
    steps = {}
    for name in manifest.files:
        if name.startswith("ledgers/") and name.endswith(".json"):
            record = read(folder / name)
            steps[record["job_id"]] = int(record["steps_done"])
    return steps


def find_evidence(
    folder: Path, manifest: bm.Manifest, data_dir: Path
) -> tuple[list[Evidence], list[Path]]:
    """The signs on the data volume that jobs ran after the backup, and the ledger files that
    disagree with the backup (to be moved aside)."""
    in_backup = _backup_steps(folder, manifest)

    def recorded(job_id: str) -> int:
        known = manifest.jobs.get(job_id)
        return max(known.steps_done if known else 0, in_backup.get(job_id, 0))

    evidence: list[Evidence] = []
    aside: list[Path] = []
    with_ledger: set[str] = set()
    # the volume's ledgers, then those an earlier restore set aside: these count only when
    # written after this backup (a job lost by that restore but older than this backup is
    # not news to it)
    earlier = sorted(ledgers_dir(data_dir).glob(f"{SET_ASIDE.format(stamp='*')}/*.json"))
    for path in [*ledger_files(data_dir), *earlier]:
        current = path.parent == ledgers_dir(data_dir)
        try:
            record = read(path)
        except ValueError as exc:
            if current:
                evidence.append(Evidence(path.stem, None, f"unreadable ledger file ({exc})"))
                aside.append(path)
            continue
        job_id, steps = record["job_id"], int(record["steps_done"])
        with_ledger.add(job_id)
        if any(e.job_id == job_id for e in evidence):
            continue
        if not current and float(record.get("updated_at") or 0) <= manifest.created_at:
            continue
        known = manifest.jobs.get(job_id)
        if known is None:
            group = record.get("budget_group")
            what = f"job {job_id} ran {steps} steps and is not in the backup"
            evidence.append(Evidence(job_id, group if isinstance(group, str) else None, what))
        elif steps > recorded(job_id):
            what = f"job {job_id} ran {steps} steps, the backup records {recorded(job_id)}"
            evidence.append(Evidence(job_id, known.budget_group, what))
        else:
            continue
        if current:
            aside.append(path)
    for run in run_folders(data_dir):
        job_id = run.name
        known = manifest.jobs.get(job_id)
        if known is None:
            if job_id not in with_ledger:
                what = (
                    f"the run folder of job {job_id}, which neither the backup nor a ledger knows"
                )
                evidence.append(Evidence(job_id, None, what))
            continue
        ckpts = checkpoint_ledgers(data_dir, job_id)
        last = ckpts[-1][0] if ckpts else 0
        if last > recorded(job_id) and not any(e.job_id == job_id for e in evidence):
            what = (
                f"job {job_id} has a checkpoint at step {last}, the backup records "
                f"{recorded(job_id)}"
            )
            evidence.append(Evidence(job_id, known.budget_group, what))
    return evidence, aside


def _reasons(
    manifest: bm.Manifest, evidence: list[Evidence], same_volume: bool, freeze_all: bool
) -> tuple[dict[str, str], list[str]]:
    """(group -> its freeze's reason, evidence groups the backup does not know)."""
    when = f"restored from the backup of {manifest.created_at_utc}"
    unattributed = [e for e in evidence if e.group is None]
    everything = None
    if freeze_all:
        everything = f"{when} with --freeze-all: what jobs spent after the backup is unknown."
    elif not same_volume:
        everything = (
            f"{when} onto a data volume that is not the backed-up one (lost or replaced): "
            "nothing tells which jobs ran after the backup, so what they spent is unknown."
        )
    elif unattributed:
        everything = (
            f"{when}; {unattributed[0].what}, so which data sets jobs spent on after the "
            "backup is unknown."
        )
    reasons: dict[str, str] = {}
    if everything is not None:
        reasons = {g: everything for g in manifest.groups}
    by_group: dict[str, list[Evidence]] = {}
    unknown: set[str] = set()
    for e in evidence:
        if e.group is None:
            continue
        if e.group not in manifest.groups:
            unknown.add(e.group)
            continue
        by_group.setdefault(e.group, []).append(e)
    for group, found in by_group.items():
        if group in reasons:
            continue
        listed = "; ".join(e.what for e in found[:MAX_JOBS_IN_REASON])
        more = len(found) - MAX_JOBS_IN_REASON
        listed += f"; and {more} more" if more > 0 else ""
        reasons[group] = (
            f"{when}, but jobs ran on this data set after that backup ({listed}), so what they "
            "spent is unknown to the restored record."
        )
    return reasons, sorted(unknown)


# -- the restore -------------------------------------------------------------------------------


def restore(settings: Settings, folder: Path, freeze_all: bool = False) -> RestoreReport:
    """Restore the backup in ``folder`` onto the configured database and data volume (the
    server stopped); what it froze, set aside and replaced."""
    manifest = bm.verify(folder)
    migrate = check_restorable(settings, manifest)
    data_dir = settings.data_dir
    same_volume = volume_id(data_dir) == manifest.volume_id
    evidence, aside = find_evidence(folder, manifest, data_dir)
    if not same_volume:  # another lineage: every ledger that is not the backup's goes aside
        aside = [
            p for p in ledger_files(data_dir) if not _same_file(p, folder / "ledgers" / p.name)
        ]
    reasons, unknown = _reasons(manifest, evidence, same_volume, freeze_all)
    report = RestoreReport(manifest, dict(reasons), evidence, unknown)
    report.migrated_from = manifest.alembic_revision if migrate else None
    report.same_volume = same_volume
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    at = int(time.time())
    data_dir.mkdir(parents=True, exist_ok=True)
    staging = data_dir / f".restore-{stamp}"
    staging.mkdir(mode=0o700)
    try:
        staged = _stage(folder, manifest, staging)
        report.replaced_database = _restore_database(
            settings, folder, manifest, reasons, at, stamp, migrate
        )
        report.set_aside = _install(data_dir, staged, aside, stamp)
        write_atomic(data_dir / VOLUME_ID, f"{manifest.volume_id}\n".encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _same_file(a: Path, b: Path) -> bool:
    return b.is_file() and a.read_bytes() == b.read_bytes()


def _stage(folder: Path, manifest: bm.Manifest, staging: Path) -> list[tuple[Path, str]]:
    """Copy the backup's ledgers and keys next to their places (same file system, so that
    installing them is a rename); (staged copy, its path under the data folder)."""
    staged = []
    for name in sorted(manifest.files):
        if name == manifest.database_file:
            continue
        copy = staging / name.replace("/", "__")
        shutil.copyfile(folder / name, copy)
        staged.append((copy, name))
    return staged


def _install(
    data_dir: Path, staged: list[tuple[Path, str]], aside: list[Path], stamp: str
) -> list[Path]:
    """Move the disagreeing ledgers (and differing keys) aside and the backup's copies in."""
    moved: list[Path] = []

    def set_aside(path: Path) -> None:
        target = path.parent / SET_ASIDE.format(stamp=stamp) / path.name
        target.parent.mkdir(mode=0o700, exist_ok=True)
        os.replace(path, target)
        moved.append(target)

    for path in aside:
        if path.exists():
            set_aside(path)
    for copy, name in staged:
        place = data_dir / name
        place.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if place.exists():
            if _same_file(place, copy) or not name.startswith(f"{SECRETS_DIR}/"):
                # the volume's SINCE stays, and so does a ledger still there: it agrees with
                # the restored record (those that do not were moved aside above)
                continue
            set_aside(place)  # a tenant's key that is not the one the database's hashes use
        os.replace(copy, place)
    ledgers_dir(data_dir).mkdir(mode=0o700, exist_ok=True)
    return moved


def _restore_database(
    settings: Settings,
    folder: Path,
    manifest: bm.Manifest,
    reasons: dict[str, str],
    at: int,
    stamp: str,
    migrate: bool,
) -> list[Path]:
    """Swap the backup's database in, migrated and with the freezes; the replaced SQLite files
    kept aside."""
    dump = folder / manifest.database_file
    if manifest.database_kind == "sqlite":
        return _restore_sqlite(settings, dump, reasons, at, stamp, migrate)
    # the dump's script empties search_path; the session's default names the tables again
    updates = "RESET search_path;\n" + "".join(
        f"UPDATE budget_groups SET frozen_reason = {dbcopy.sql_literal(reason)}, "
        f"frozen_at = {at} WHERE id = {dbcopy.sql_literal(group)} AND frozen_reason IS NULL;\n"
        for group, reason in sorted(reasons.items())
    )
    dbcopy.pg_load(settings.sqlalchemy_url, dump, "" if migrate else updates)
    # the freezes' audit entries (and, after a migration, the freezes themselves): a failure
    # here leaves the groups frozen by the transaction above, or the database at the backup's
    # migration, which a second restore redoes
    _migrate_and_freeze(settings, reasons, at, migrate)
    return []


def _restore_sqlite(
    settings: Settings,
    dump: Path,
    reasons: dict[str, str],
    at: int,
    stamp: str,
    migrate: bool,
) -> list[Path]:
    target = Path(settings.sqlalchemy_url.removeprefix("sqlite:///"))
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = target.with_name(f"{target.name}.restore-{stamp}")
    try:
        dbcopy.sqlite_load(dump, fresh)
        _migrate_and_freeze(
            settings.model_copy(update={"database_url": f"sqlite:///{fresh}"}), reasons, at, migrate
        )
        dbcopy.sqlite_settle(fresh)
    except BaseException:
        for path in dbcopy.sqlite_files(fresh):
            path.unlink()
        raise
    kept = []
    for path in dbcopy.sqlite_files(target):
        old = path.with_name(
            path.name.replace(target.name, f"{target.name}.before-restore-{stamp}", 1)
        )
        os.replace(path, old)
        kept.append(old)
    os.replace(fresh, target)
    return kept


def _migrate_and_freeze(
    settings: Settings, reasons: dict[str, str], at: int, migrate: bool
) -> None:
    engine = make_engine(settings)
    try:
        if migrate:
            upgrade(engine)
        with make_sessionmaker(engine)() as session:
            groups = session.scalars(select(BudgetGroup).where(BudgetGroup.id.in_(sorted(reasons))))
            for group in sorted(groups, key=lambda g: g.seq):
                freezes.freeze(session, group, reasons[group.id], at)
            session.commit()
    finally:
        engine.dispose()


def report_lines(report: RestoreReport) -> list[str]:
    """What a restore did, one line each (the CLI prints them)."""
    m = report.manifest
    lines = [
        f"restored the {m.database_kind} backup of {m.created_at_utc} "
        f"(migration {m.alembic_revision}, {len(m.jobs)} jobs, {len(m.groups)} data sets)"
    ]
    if not report.same_volume:
        lines.append(
            "the data volume is not the one the backup was taken from (its volume-id differs or "
            "is missing): every data set is frozen"
        )
    if report.migrated_from:
        lines.append(f"migrated the database from {report.migrated_from} to this release's head")
    lines += [f"after the backup: {e.what}" for e in report.evidence]
    lines += [f"frozen: {g}: {reason}" for g, reason in sorted(report.frozen.items())]
    lines += [
        f"not frozen: data set {g} is not in the backup (uploaded after it); its jobs' spending "
        "and its examples' hashes are lost: a re-upload of its data starts a fresh budget"
        for g in report.unknown_groups
    ]
    lines += [f"set aside: {p}" for p in report.set_aside]
    lines += [f"kept the replaced database as {p}" for p in report.replaced_database]
    return lines


def manifest_summary(folder: Path) -> str:
    """One line about the backup in ``folder`` without verifying it (for a confirmation)."""
    body = json.loads((folder / bm.MANIFEST).read_text())
    db = body.get("database", {})
    revision = db.get("alembic_revision")
    return f"{db.get('kind')} backup of {body.get('created_at_utc')} (migration {revision})"
