"""uploads: files uploaded in parts (the OpenAI Uploads API), and their parts

An upload reserves its announced bytes against the tenant's storage quota while it is pending;
its parts live on disk under ``files/<tenant>/uploads/<upload id>/`` until it is completed (into
an ordinary file), cancelled or expired (docs/api.md, "Uploads").

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("completing_at", sa.BigInteger(), nullable=True),
        sa.Column("part_ids", sa.JSON(), nullable=True),
        sa.Column("epsilon_budget", sa.Float(), nullable=True),
        sa.Column("delta", sa.Float(), nullable=True),
        sa.Column("unbudgeted", sa.Boolean(), nullable=False),
        sa.Column("file_id", sa.String(length=40), nullable=True),
        sa.Column("created_by", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.ForeignKeyConstraint(["file_id"], ["files.id"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    op.create_index("ix_uploads_tenant_status", "uploads", ["tenant_id", "status"])
    op.create_index("ix_uploads_status_expires", "uploads", ["status", "expires_at"])

    op.create_table(
        "upload_parts",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["upload_id"], ["uploads.id"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    op.create_index("ix_upload_parts_upload_id", "upload_parts", ["upload_id"])


def downgrade() -> None:
    op.drop_index("ix_upload_parts_upload_id", table_name="upload_parts")
    op.drop_table("upload_parts")
    op.drop_index("ix_uploads_status_expires", table_name="uploads")
    op.drop_index("ix_uploads_tenant_status", table_name="uploads")
    op.drop_table("uploads")
