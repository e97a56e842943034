"""job sharding: how a job's ranks hold the model ("none": each the whole model; "fsdp":
FSDP2-sharded over the job's devices)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("sharding", sa.String(length=16), nullable=False, server_default="none")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("sharding")
