"""Opening the store: engine, migrations, session factory."""

from __future__ import annotations

from api.common import Store
from api.db import make_engine, make_sessionmaker, upgrade
from api.settings import Settings


def open_store(settings: Settings) -> Store:
    engine = make_engine(settings)
    upgrade(engine)
    settings.files_dir.mkdir(parents=True, exist_ok=True)
    return Store(settings=settings, engine=engine, sessions=make_sessionmaker(engine))
