"""job devices: how many devices of one host a job trains on (data-parallel ranks)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("devices", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("devices")
