"""Migration 0017 drops the hash tables' foreign keys (at 10⁷ rows an upload their checks were
two thirds of PostgreSQL's recording) and keeps their rows, unique constraints and indexes;
``dprc admin check`` finds what the foreign keys used to refuse; 0017 goes down again."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.admin.consistency import check
from service.base.settings import Settings
from service.store.db import make_engine, upgrade
from service.store.store import open_store
from service.store.tables import BudgetGroup
from tests.api.conftest import fresh_pg_database
from tests.migration_steps import migrate

TABLES = ("example_hashes", "example_users")


def _shape(engine: sa.Engine, table: str) -> tuple:
    inspector = sa.inspect(engine)
    return (
        sorted(c["name"] for c in inspector.get_columns(table)),
        sorted(
            (u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)
        ),
        sorted((i["name"], tuple(i["column_names"])) for i in inspector.get_indexes(table)),
    )


def _keys(engine: sa.Engine, table: str) -> list[tuple]:
    return sorted(
        (tuple(fk["constrained_columns"]), fk["referred_table"])
        for fk in sa.inspect(engine).get_foreign_keys(table)
    )


def _insert(conn: sa.Connection, tenant: int, digest: str, group: str) -> None:
    conn.execute(
        sa.text("INSERT INTO example_hashes (tenant_id, digest, group_id) VALUES (:t, :d, :g)"),
        {"t": tenant, "d": digest, "g": group},
    )
    conn.execute(
        sa.text(
            "INSERT INTO example_users (tenant_id, digest, user_digest, group_id) "
            "VALUES (:t, :d, :u, :g)"
        ),
        {"t": tenant, "d": digest, "u": "u" + digest, "g": group},
    )


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_0017_drops_the_hash_foreign_keys_and_the_check_stands_in(backend, tmp_path):
    with fresh_pg_database("dprc_0017") if backend == "postgresql" else nullcontext(None) as url:
        settings = Settings(data_dir=tmp_path, database_url=url)
        engine = make_engine(settings)

        try:
            migrate(engine, "0016")
            before = {t: _shape(engine, t) for t in TABLES}
            assert {t: _keys(engine, t) for t in TABLES} == {
                t: [(("group_id",), "budget_groups"), (("tenant_id",), "tenants")] for t in TABLES
            }
            with engine.begin() as conn:
                for tenant in (1, 2):
                    conn.execute(
                        sa.text("INSERT INTO tenants (id, name, created_at) VALUES (:i, :n, 1)"),
                        {"i": tenant, "n": f"t{tenant}"},
                    )
            with Session(engine) as session:  # the table as the code of 0016 writes it
                session.add(BudgetGroup(id="bg-a", tenant_id=1, created_at=1, n_examples=1))
                session.commit()
            with engine.begin() as conn:
                _insert(conn, 1, "d1", "bg-a")
            # the foreign keys at 0016 refuse a row of a data set that does not exist
            with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
                _insert(conn, 1, "d2", "bg-missing")

            upgrade(engine)  # to head, as the service does at start-up
            assert {t: _keys(engine, t) for t in TABLES} == {t: [] for t in TABLES}
            assert {t: _shape(engine, t) for t in TABLES} == before
            with engine.connect() as conn:
                for t in TABLES:
                    rows = conn.execute(sa.text(f"SELECT tenant_id, digest, group_id FROM {t}"))
                    assert rows.all() == [(1, "d1", "bg-a")]

            store = open_store(settings)
            assert check(store).problems == []
            with engine.begin() as conn:  # what the foreign keys refused, and a tenant's
                _insert(conn, 1, "d2", "bg-missing")  # row naming another tenant's data set
                _insert(conn, 2, "d3", "bg-a")
            problems = check(store).problems
            assert sorted(problems) == [
                "example_hashes: 2 rows name a data set that their tenant does not have "
                "(first: bg-a)",
                "example_users: 2 rows name a data set that their tenant does not have "
                "(first: bg-a)",
            ]
            store.engine.dispose()

            with engine.begin() as conn:
                for t in TABLES:
                    conn.execute(sa.text(f"DELETE FROM {t} WHERE digest <> 'd1'"))
            migrate(engine, "0016", down=True)
            assert {t: _keys(engine, t) for t in TABLES} == {
                t: [(("group_id",), "budget_groups"), (("tenant_id",), "tenants")] for t in TABLES
            }
            assert {t: _shape(engine, t) for t in TABLES} == before
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT count(*) FROM example_users")).scalar() == 1
        finally:
            engine.dispose()
