"""job sketch: how the job's randomized clipping drew its projections, as accounted (shared |
per_example); every job before it had shared ones

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-08 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "accounting_sketch", sa.String(length=16), nullable=False, server_default="shared"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("accounting_sketch")
