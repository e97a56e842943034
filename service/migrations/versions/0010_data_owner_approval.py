"""data owners approve uploads; example hashes keyed on the canonical text

A file records its approval ("approved", "pending", "rejected"), the budget its uploader asked
for, the overlap report computed at upload and who decided it when; a tenant records whether
its trainers may budget their own uploads, how its example hashes are keyed (1: raw text,
2: canonical text, re-keyed at start-up by service/rekey.py) and whether raw-text hashes that
could not be re-keyed remain (in legacy_example_hashes, looked up by uploads); a per-user data
set's lines keep their users (example_users: the example's and the user's keyed hashes).
Existing files are approved (they were budgeted at upload).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "legacy_example_hashes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column(
            "group_id", sa.String(length=40), sa.ForeignKey("budget_groups.id"), nullable=False
        ),
        sa.UniqueConstraint("tenant_id", "digest", name="uq_legacy_example_hash"),
    )
    op.create_index("ix_legacy_example_hashes_group_id", "legacy_example_hashes", ["group_id"])
    op.create_table(
        "example_users",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("user_digest", sa.String(length=64), nullable=False),
        sa.Column(
            "group_id", sa.String(length=40), sa.ForeignKey("budget_groups.id"), nullable=False
        ),
        sa.UniqueConstraint("tenant_id", "digest", "user_digest", name="uq_example_user"),
    )
    op.create_index("ix_example_users_group_id", "example_users", ["group_id"])
    op.create_index("ix_example_users_user", "example_users", ["tenant_id", "user_digest"])
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column(
                "trainers_set_budgets", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
        batch.add_column(
            sa.Column("hash_version", sa.Integer(), nullable=False, server_default="1")
        )
        batch.add_column(
            sa.Column("legacy_hashes", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("files") as batch:
        batch.add_column(
            sa.Column("approval", sa.String(length=16), nullable=False, server_default="approved")
        )
        batch.add_column(sa.Column("requested_budget", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("overlap_report", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("decided_by", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("decided_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_index("ix_example_users_user", table_name="example_users")
    op.drop_index("ix_example_users_group_id", table_name="example_users")
    op.drop_table("example_users")
    op.drop_index("ix_legacy_example_hashes_group_id", table_name="legacy_example_hashes")
    op.drop_table("legacy_example_hashes")
    # plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35): a batch would copy and drop these
    # tables, which other tables' rows reference
    for name in ("decided_at", "decided_by", "overlap_report", "requested_budget", "approval"):
        op.drop_column("files", name)
    for name in ("legacy_hashes", "hash_version", "trainers_set_budgets"):
        op.drop_column("tenants", name)
