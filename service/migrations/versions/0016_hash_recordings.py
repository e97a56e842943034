"""big uploads' example hashes recorded in short transactions: the ``hash_recordings`` table
(one row a tenant while its hashes are recorded; service/data/hash_recordings.py)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 20:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hash_recordings",
        sa.Column(
            "tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), primary_key=True, nullable=False
        ),
        sa.Column("token", sa.String(length=40), nullable=False),
        sa.Column("file_id", sa.String(length=40), nullable=False),
        sa.Column("upload_id", sa.String(length=40), nullable=True),
        sa.Column("group_id", sa.String(length=40), nullable=True),
        sa.Column("new_group", sa.Boolean(), nullable=False),
        sa.Column("base_id", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("beat_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hash_recordings")
