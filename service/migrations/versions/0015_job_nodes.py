"""job nodes: how many hosts a job trains on (``nodes × devices`` ranks, launched through Ray
when more than one; every job before this migration ran on one host)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 21:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("nodes")
