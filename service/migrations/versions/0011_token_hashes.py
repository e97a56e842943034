"""token hashes: the keyed digests of the token-id sequences each budget group's jobs trained on

One row per (tenant, tokenizer fingerprint, keyed digest), naming the budget group whose job
recorded it (service/token_hashes.py): a later job of another group whose data tokenizes the
same fails before its first step (``budget_group_overlap``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-13 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "token_hashes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("tokenizer", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column(
            "group_id", sa.String(length=40), sa.ForeignKey("budget_groups.id"), nullable=False
        ),
        sa.UniqueConstraint("tenant_id", "tokenizer", "digest", name="uq_token_hash"),
    )
    op.create_index("ix_token_hashes_group_id", "token_hashes", ["group_id"])


def downgrade() -> None:
    op.drop_index("ix_token_hashes_group_id", table_name="token_hashes")
    op.drop_table("token_hashes")
