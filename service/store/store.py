"""The store as the domains use it (settings, engine, session factory), how it is opened
(engine, migrations to head, the files folder), its health check and the store's errors the
HTTP layer maps (:data:`StoreValueRefused`, :data:`StoreError`, :func:`is_contention`), so
that nothing above the domain layer imports the database library."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.base.settings import Settings
from service.store.db import make_engine, make_sessionmaker, migrations_at_head, upgrade


@dataclass(frozen=True)
class Store:
    """What the domains need from the running process: settings and a session factory."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]


def open_store(settings: Settings) -> Store:
    from service.store.ledger_folder import ensure_dir

    engine = make_engine(settings)
    upgrade(engine)
    settings.files_dir.mkdir(parents=True, exist_ok=True)
    ensure_dir(settings.data_dir)  # the job ledgers' folder, and since when they are kept
    return Store(settings=settings, engine=engine, sessions=make_sessionmaker(engine))


def ping(store: Store) -> None:
    """Raise if the database does not answer a trivial query."""
    with store.sessions() as session:
        session.execute(text("SELECT 1"))


def readiness(store: Store) -> dict[str, str]:
    """What ``/readyz`` reports of the store: the database answers, and its schema is at the
    code's migration head (``"ok"`` each, else why not)."""
    checks: dict[str, str] = {}
    try:
        ping(store)
        checks["store"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        checks["store"] = f"error: {type(exc).__name__}"
        checks["migrations"] = "unknown: the database does not answer"
        return checks
    try:
        ok, current, head = migrations_at_head(store.engine)
        checks["migrations"] = "ok" if ok else f"error: at {current}, the code needs {head}"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        checks["migrations"] = f"error: {type(exc).__name__}"
    return checks


# a value the database cannot store (e.g. NUL in PostgreSQL text): the client's error
StoreValueRefused = DataError
# the database failed the statement (contention, :func:`is_contention`, or a fault)
StoreError = OperationalError


def is_contention(exc: OperationalError) -> bool:
    """Whether ``exc`` is contention — SQLite's write lock held past the busy timeout, a
    PostgreSQL lock or serialization time-out — rather than a fault: the statement changed
    nothing and a retry may succeed."""
    message = str(exc.orig).lower()
    return any(w in message for w in ("locked", "lock timeout", "could not serialize"))
