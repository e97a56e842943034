"""The store as the domains use it (settings, engine, session factory) and how it is opened:
engine, migrations to head, the files folder."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine, make_sessionmaker, upgrade
from service.settings import Settings


@dataclass(frozen=True)
class Store:
    """What the domains need from the running process: settings and a session factory."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]


def open_store(settings: Settings) -> Store:
    engine = make_engine(settings)
    upgrade(engine)
    settings.files_dir.mkdir(parents=True, exist_ok=True)
    return Store(settings=settings, engine=engine, sessions=make_sessionmaker(engine))
