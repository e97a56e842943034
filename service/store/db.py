"""Engine, sessions and migrations (Alembic, applied at start-up)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.base.settings import Settings

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(settings: Settings) -> Engine:
    url = settings.sqlalchemy_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _sqlite_transactions(engine)
        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def _sqlite_transactions(engine: Engine) -> None:
    """SQLite: take over BEGIN from pysqlite so that a session can ask for BEGIN IMMEDIATE
    (the database write lock, taken before the first read) with the execution option
    ``sqlite_immediate=True`` — SQLite's equivalent of SELECT ... FOR UPDATE."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def locked_session(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose transaction holds the database write lock from its start on SQLite
    (BEGIN IMMEDIATE); on PostgreSQL rows are locked with SELECT ... FOR UPDATE by callers."""
    with factory() as session:
        engine = session.get_bind()
        if isinstance(engine, Engine) and is_sqlite(engine):
            session.connection(execution_options={"sqlite_immediate": True})
        yield session


_UPGRADE_LOCK = threading.Lock()


def migrations_at_head(engine: Engine) -> tuple[bool, str | None, str]:
    """Whether the database's Alembic revision is the code's head: (at head, the database's
    revision or None, the head)."""
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current == head, current, head


def upgrade(engine: Engine) -> None:
    """Apply the Alembic migrations up to head on ``engine``. One thread at a time: Alembic's
    ``context`` is a module-global proxy, so two threads of one process (a Celery task and the
    worker's sweeper opening the store together) would corrupt each other's run."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with _UPGRADE_LOCK, engine.connect() as conn:
        sqlite = is_sqlite(engine)
        raw = conn.connection.dbapi_connection
        if sqlite and raw is not None:
            # a batch migration recreates a table (copy, DROP, rename): SQLite's foreign keys
            # must be off for it, and that is only possible outside a transaction
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise RuntimeError(f"migration left broken foreign keys: {broken[:5]}")
        finally:
            if sqlite and raw is not None:
                raw.execute("PRAGMA foreign_keys=ON")
