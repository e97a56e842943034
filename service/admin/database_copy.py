"""Copies of the database for backups, and their way back.

* **SQLite**: :func:`sqlite_backup` uses SQLite's online backup API
  (:meth:`sqlite3.Connection.backup`): a consistent copy while the server runs and writes,
  left in rollback-journal mode so that the copy is one file. :func:`sqlite_load` copies a
  backup into a new file next to the database, which the restore renames into place.
* **PostgreSQL**: :func:`pg_backup` runs ``pg_dump --format=custom`` in a snapshot exported by
  a REPEATABLE READ transaction (``--snapshot``), in which the manifest's jobs and groups are
  read too: the dump and the manifest describe one moment. :func:`pg_load` turns the dump into
  SQL (``pg_restore --clean --if-exists --no-owner --no-privileges``) and runs it with the
  restore's own statements in **one** transaction (``psql --single-transaction``, stopping at the
  first error): either all of it is restored or nothing changes. ``pg_dump``, ``pg_restore``
  and ``psql`` are found on ``PATH`` (``postgresql-client``, of the server's major version or
  newer).

The snapshot's facts (:class:`Snapshot`) are read with plain SQL, the same on both.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL, make_url

from service.admin.backup_manifest import JobAtBackup

# the jobs, and the synthetic-data jobs (a drawn label histogram: one step; their ledger files
# are kept as the jobs' are, service/synthetic/synthetic_runs.py)
JOBS_SQL = (
    "SELECT j.id, j.tenant_id, f.group_id, j.status, j.steps_done "
    "FROM jobs j JOIN files f ON f.id = j.training_file_id"
)
SYNTHETIC_JOBS_SQL = (
    " UNION ALL SELECT s.id, s.tenant_id, s.group_id, s.status, s.steps_done FROM synthetic_jobs s"
)
SYNTHETIC_JOBS_SINCE = "0014"  # the revision that made synthetic_jobs


def jobs_sql(revision: str) -> str:
    """The manifest's jobs at ``revision``: the synthetic-data jobs too once they exist."""
    return JOBS_SQL + (SYNTHETIC_JOBS_SQL if revision >= SYNTHETIC_JOBS_SINCE else "")


GROUPS_SQL = "SELECT id, tenant_id FROM budget_groups"
REVISION_SQL = "SELECT version_num FROM alembic_version"
# a restore waits this long for a table lock (a server still connected) before giving up
PG_LOCK_TIMEOUT = "30s"


@dataclass(frozen=True)
class Snapshot:
    """What the copied database held: its Alembic revision, its jobs and budget groups."""

    revision: str
    jobs: dict[str, JobAtBackup]
    groups: dict[str, int]


def _snapshot(
    rows: Iterable[Iterable[object]], groups: Iterable[Iterable[object]], rev: str
) -> Snapshot:
    jobs: dict[str, JobAtBackup] = {}
    for job_id, tenant_id, group_id, status, steps in (tuple(r) for r in rows):
        jobs[str(job_id)] = JobAtBackup(
            int(str(tenant_id)),
            None if group_id is None else str(group_id),
            str(status),
            int(str(steps)),
        )
    return Snapshot(rev, jobs, {str(g): int(str(t)) for g, t in (tuple(r) for r in groups)})


# -- SQLite -------------------------------------------------------------------------------------


def sqlite_backup(source: Path, target: Path) -> Snapshot:
    """Copy the live database ``source`` into the new file ``target`` (online backup API), in
    rollback-journal mode; its facts read from the copy."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (
        closing(sqlite3.connect(source, timeout=30)) as src,
        closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")
        row = dst.execute(REVISION_SQL).fetchone()
        revision = str(row[0]) if row else ""
        snap = _snapshot(
            dst.execute(jobs_sql(revision)).fetchall(),
            dst.execute(GROUPS_SQL).fetchall(),
            revision,
        )
    return snap


def sqlite_load(backup_file: Path, target: Path) -> None:
    """Copy the backed-up database into the new file ``target`` (not yet in use)."""
    with (
        closing(sqlite3.connect(f"file:{backup_file}?mode=ro", uri=True)) as src,
        closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)


def sqlite_settle(path: Path) -> None:
    """Fold the write-ahead log of a database no one else has open into its file, so that
    it can be renamed alone."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")


def sqlite_files(path: Path) -> list[Path]:
    """The database file and its write-ahead log and shared memory, where they exist."""
    return [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]


# -- PostgreSQL --------------------------------------------------------------------------------


def pg_tool(name: str) -> str:
    """The path of ``pg_dump``, ``pg_restore`` or ``psql``; RuntimeError when absent."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"{name} is not on PATH: install the PostgreSQL client tools "
            "(Debian/Ubuntu: apt-get install postgresql-client) of the server's major version "
            "or newer"
        )
    return found


def libpq_target(sqlalchemy_url: str) -> tuple[str, dict[str, str]]:
    """(a libpq URL without the password, the environment that carries the password)."""
    url = make_url(sqlalchemy_url)
    plain = URL.create(
        "postgresql",
        username=url.username,
        host=url.host,
        port=url.port,
        database=url.database,
        query=url.query,
    )
    env = dict(os.environ)
    if url.password is not None:
        env["PGPASSWORD"] = str(url.password)
    return plain.render_as_string(hide_password=False), env


def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def pg_backup(engine: Engine, sqlalchemy_url: str, target: Path) -> Snapshot:
    """``pg_dump --format=custom`` of the database into ``target``, in the snapshot the facts
    are read in."""
    pg_dump = pg_tool("pg_dump")
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    dsn, env = libpq_target(sqlalchemy_url)
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        with conn.begin():
            name = conn.execute(text("SELECT pg_export_snapshot()")).scalar_one()
            revision = str(conn.execute(text(REVISION_SQL)).scalar() or "")
            snap = _snapshot(
                conn.execute(text(jobs_sql(revision))).all(),
                conn.execute(text(GROUPS_SQL)).all(),
                revision,
            )
            argv = [pg_dump, "--format=custom", "--no-owner", "--no-privileges"]
            argv += [f"--snapshot={name}", f"--file={target}", f"--dbname={dsn}"]
            _run(argv, env, "pg_dump")
    return snap


def pg_load(sqlalchemy_url: str, dump: Path, extra_sql: str) -> None:
    """Replace the database's tables by the dump's and run ``extra_sql`` after them, in one
    transaction (nothing changes unless all of it succeeds)."""
    pg_restore, psql = pg_tool("pg_restore"), pg_tool("psql")
    dsn, env = libpq_target(sqlalchemy_url)
    with tempfile.TemporaryDirectory(prefix="dprc-restore-") as tmp:
        plain, script, extra = (Path(tmp) / n for n in ("dump.sql", "restore.sql", "after.sql"))
        argv = [pg_restore, "--clean", "--if-exists", "--no-owner", "--no-privileges"]
        _run([*argv, f"--file={plain}", str(dump)], env, "pg_restore")
        _with_lock_timeout(plain, script)
        plain.unlink()
        extra.write_text(extra_sql)
        argv = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction"]
        _run([*argv, f"--dbname={dsn}", f"--file={script}", f"--file={extra}"], env, "psql")


def _with_lock_timeout(plain: Path, script: Path) -> None:
    """The script with pg_dump's ``SET lock_timeout = 0;`` (wait for ever) replaced by
    :data:`PG_LOCK_TIMEOUT`, so that a restore blocked by a connected server fails (and rolls
    back) instead of hanging."""
    wanted = f"SET lock_timeout = '{PG_LOCK_TIMEOUT}';\n"
    replaced = False
    with plain.open() as src, script.open("w") as dst:
        for line in src:
            if not replaced and line == "SET lock_timeout = 0;\n":
                line, replaced = wanted, True
            dst.write(line)
    if not replaced:  # a pg_restore that writes no such line: the script's first statement
        script.write_text(wanted + script.read_text())


def sql_literal(value: str | int | None) -> str:
    """A value as a PostgreSQL literal (standard-conforming strings, as pg_dump's script sets)."""
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("'", "''") + "'"
