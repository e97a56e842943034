"""synthetic-data jobs: the ``synthetic_jobs`` table, and ``files.synthetic`` (a synthetic data
set's provenance, written by its job only)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 14:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "synthetic_jobs",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(length=40), nullable=False, unique=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(length=40), nullable=True),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("source_job_id", sa.String(length=40), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("training_file_id", sa.String(length=40), nullable=False),
        sa.Column(
            "group_id", sa.String(length=40), sa.ForeignKey("budget_groups.id"), nullable=False
        ),
        sa.Column("holdout_file_id", sa.String(length=40), nullable=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("privacy", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("records_done", sa.Integer(), nullable=False),
        sa.Column("steps_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("result_file_id", sa.String(length=40), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=True),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
    )
    op.create_index("ix_synthetic_jobs_tenant_id", "synthetic_jobs", ["tenant_id"])
    op.create_index("ix_synthetic_jobs_status", "synthetic_jobs", ["status"])
    op.create_index("ix_synthetic_jobs_source_job_id", "synthetic_jobs", ["source_job_id"])
    op.create_index("ix_synthetic_jobs_group_id", "synthetic_jobs", ["group_id"])
    op.create_index("ix_synthetic_jobs_tenant_seq", "synthetic_jobs", ["tenant_id", "seq"])
    # a plain ALTER TABLE on both databases: rebuilding ``files`` (what a batch operation does
    # on SQLite) is forbidden there by the other tables' foreign keys to it
    op.add_column("files", sa.Column("synthetic", sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE files DROP COLUMN synthetic")  # SQLite >= 3.35, no rebuild
    else:
        op.drop_column("files", "synthetic")
    op.drop_table("synthetic_jobs")
