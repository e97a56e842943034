"""Alembic environment: runs on the connection given by ``service.store.db.upgrade`` or, from the
``alembic`` command line, on the engine for the current ``DPRC_*`` settings."""

from __future__ import annotations

from alembic import context

from service.store.tables import Base

target_metadata = Base.metadata


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    from service.base.settings import Settings
    from service.store.db import make_engine

    engine = make_engine(Settings())
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
