"""budget freeze: a data set's budget group can be frozen (no new job) with a reason

``dprc admin restore`` freezes the groups whose jobs ran after the backup it restores (their
spending is unknown to the restored database) until an admin acknowledges them
(docs/operations.md, "Backups").

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("budget_groups") as batch:
        batch.add_column(sa.Column("frozen_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("frozen_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("budget_groups") as batch:
        batch.drop_column("frozen_at")
        batch.drop_column("frozen_reason")
