"""privacy unit: data sets whose lines name their users (user-level DP)

A file records the field naming its users, their number and the most lines one of them has; an
upload in parts records the field it was announced with; a budget group records whether its ε
is per example or per user (docs/privacy_unit.md).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("user_field", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("n_users", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("max_lines_per_user", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("uploads") as batch:
        batch.add_column(sa.Column("user_field", sa.String(length=64), nullable=True))
    with op.batch_alter_table("budget_groups") as batch:
        batch.add_column(
            sa.Column(
                "privacy_unit", sa.String(length=16), nullable=False, server_default="example"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("budget_groups") as batch:
        batch.drop_column("privacy_unit")
    with op.batch_alter_table("uploads") as batch:
        batch.drop_column("user_field")
    with op.batch_alter_table("files") as batch:
        batch.drop_column("max_lines_per_user")
        batch.drop_column("n_users")
        batch.drop_column("user_field")
