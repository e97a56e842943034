"""an upload's hash rows (``example_hashes``, ``example_users``) without foreign keys

At 10⁷ examples an upload records 10⁷ rows; on PostgreSQL each row's two foreign-key checks
(a ``FOR KEY SHARE`` lock on its tenant's and its group's row) were two thirds of the recording
(docs/benchmarks/big_n.md). What they guarded — no hash row of a tenant or a group that does
not exist — holds by construction (tenants are never deleted; the one group delete, a failed
recording's rollback in service/data/hash_recordings.py, deletes the group's hashes first) and
``dprc admin check`` verifies it (service/admin/consistency.py).

SQLite cannot drop a constraint: its tables are rebuilt (copy, drop, rename) from a definition
without the foreign keys, their indexes and unique constraints as before.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# (table, its foreign-key columns and their targets)
_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "example_hashes": (("tenant_id", "tenants.id"), ("group_id", "budget_groups.id")),
    "example_users": (("tenant_id", "tenants.id"), ("group_id", "budget_groups.id")),
}


def _table(name: str, with_keys: bool) -> sa.Table:
    """The table as migrations 0005 / 0010 made it, with or without its foreign keys."""
    md = sa.MetaData()
    if with_keys:  # the targets, so that the foreign keys resolve
        sa.Table("tenants", md, sa.Column("id", sa.Integer(), primary_key=True))
        sa.Table("budget_groups", md, sa.Column("id", sa.String(length=40), primary_key=True))
    key = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    refs = dict(_KEYS[name]) if with_keys else {}

    def col(column: str, type_: sa.types.TypeEngine) -> sa.Column:
        fk = [sa.ForeignKey(refs[column])] if column in refs else []
        return sa.Column(column, type_, *fk, nullable=False)

    if name == "example_hashes":
        return sa.Table(
            name,
            md,
            sa.Column("id", key, primary_key=True, autoincrement=True),
            col("tenant_id", sa.Integer()),
            col("digest", sa.String(length=64)),
            col("group_id", sa.String(length=40)),
            sa.UniqueConstraint("tenant_id", "digest", name="uq_example_hash"),
            sa.Index("ix_example_hashes_group_id", "group_id"),
        )
    return sa.Table(
        name,
        md,
        sa.Column("id", key, primary_key=True, autoincrement=True),
        col("tenant_id", sa.Integer()),
        col("digest", sa.String(length=64)),
        col("user_digest", sa.String(length=64)),
        col("group_id", sa.String(length=40)),
        sa.UniqueConstraint("tenant_id", "digest", "user_digest", name="uq_example_user"),
        sa.Index("ix_example_users_group_id", "group_id"),
        sa.Index("ix_example_users_user", "tenant_id", "user_digest"),
    )


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _rebuild_sqlite(with_keys: bool) -> None:
    """SQLite: both tables copied into the definition with or without their foreign keys."""
    for name in _KEYS:
        with op.batch_alter_table(name, recreate="always", copy_from=_table(name, with_keys)):
            pass


def upgrade() -> None:
    if _sqlite():
        _rebuild_sqlite(with_keys=False)
        return
    inspector = sa.inspect(op.get_bind())
    for name in _KEYS:
        for fk in inspector.get_foreign_keys(name):
            if fk["name"]:
                op.drop_constraint(fk["name"], name, type_="foreignkey")


def downgrade() -> None:
    if _sqlite():
        _rebuild_sqlite(with_keys=True)
        return
    for name, keys in _KEYS.items():
        for column, target in keys:
            table, target_column = target.split(".")
            op.create_foreign_key(f"{name}_{column}_fkey", name, table, [column], [target_column])
