"""a file's data format up to 32 characters: ``prompt_completion`` (17) is one

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _sqlite() -> bool:
    # SQLite does not enforce a VARCHAR's length, and altering a column there means rebuilding
    # the table, which the other tables' foreign keys to ``files`` forbid: nothing to do
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    if _sqlite():
        return
    with op.batch_alter_table("files") as batch:
        batch.alter_column(
            "data_format",
            existing_type=sa.String(length=16),
            type_=sa.String(length=32),
            existing_nullable=True,
        )


def downgrade() -> None:
    if _sqlite():
        return
    with op.batch_alter_table("files") as batch:
        batch.alter_column(
            "data_format",
            existing_type=sa.String(length=32),
            type_=sa.String(length=16),
            existing_nullable=True,
        )
