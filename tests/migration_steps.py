"""Moving a test's database to one Alembic revision, up or down (the service itself only
migrates up to head: ``service.store.db.upgrade``)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from service.store.db import MIGRATIONS


def migrate(engine: sa.Engine, revision: str, down: bool = False) -> None:
    """Upgrade (or, with ``down``, downgrade) ``engine``'s database to ``revision``, in one
    transaction."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
