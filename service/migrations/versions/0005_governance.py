"""governance: key roles, budget groups with example hashes, the audit log, server-side
dashboard sessions, who created files and jobs

Every existing key becomes an ``admin`` (it could do everything before). Each existing
fine-tune data set gets a budget group of its own holding its budget and cached totals; its
examples were never hashed, so a later upload cannot join it by content (docs/governance.md).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 05:00:00
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("role", sa.String(length=16), nullable=False, server_default="admin")
        )
        batch.add_column(sa.Column("name", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("created_by", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("revoked_by", sa.String(length=40), nullable=True))

    op.create_table(
        "budget_groups",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("n_examples", sa.BigInteger(), nullable=False),
        sa.Column("epsilon_budget", sa.Float(), nullable=True),
        sa.Column("delta", sa.Float(), nullable=True),
        sa.Column("epsilon_spent", sa.Float(), nullable=False),
        sa.Column("epsilon_committed", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    op.create_index("ix_budget_groups_tenant_id", "budget_groups", ["tenant_id"])

    op.create_table(
        "example_hashes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("group_id", sa.String(length=40), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.ForeignKeyConstraint(["group_id"], ["budget_groups.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "digest", name="uq_example_hash"),
    )
    op.create_index("ix_example_hashes_group_id", "example_hashes", ["group_id"])

    op.create_table(
        "audit_log",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("action", sa.String(length=48), nullable=False),
        sa.Column("resource", sa.String(length=64), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
        sa.UniqueConstraint("tenant_id", "prev_hash", name="uq_audit_chain"),
    )
    op.create_index("ix_audit_tenant_seq", "audit_log", ["tenant_id", "seq"])

    op.create_table(
        "audit_heads",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("last_hash", sa.String(length=64), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("tenant_id"),
    )

    op.create_table(
        "dashboard_sessions",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["key_id"], ["api_keys.id"]),
        sa.PrimaryKeyConstraint("token_hash"),
    )
    op.create_index("ix_dashboard_sessions_key_id", "dashboard_sessions", ["key_id"])

    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("group_id", sa.String(length=40), nullable=True))
        batch.add_column(
            sa.Column("unbudgeted", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("deleted_at", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("created_by", sa.String(length=40), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("created_by", sa.String(length=40), nullable=True))

    # each fine-tune data set: a group of its own with its budget and cached totals
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, tenant_id, created_at, n_examples, epsilon_budget, delta, "
            "epsilon_spent, epsilon_committed FROM files WHERE n_examples IS NOT NULL"
        )
    ).fetchall()
    for file_id, tenant_id, created_at, n, eps_b, delta, spent, committed in rows:
        group_id = f"bg-{secrets.token_hex(12)}"
        conn.execute(
            sa.text(
                "INSERT INTO budget_groups (id, tenant_id, created_at, n_examples, "
                "epsilon_budget, delta, epsilon_spent, epsilon_committed) VALUES "
                "(:id, :t, :c, :n, :e, :d, :s, :m)"
            ),
            {
                "id": group_id,
                "t": tenant_id,
                "c": created_at,
                "n": n,
                "e": eps_b,
                "d": delta,
                "s": spent or 0.0,
                "m": committed or 0.0,
            },
        )
        conn.execute(
            sa.text("UPDATE files SET group_id = :g WHERE id = :f"), {"g": group_id, "f": file_id}
        )

    with op.batch_alter_table("files") as batch:
        batch.create_foreign_key("fk_files_group_id", "budget_groups", ["group_id"], ["id"])
        batch.create_index("ix_files_group_id", ["group_id"])
        batch.drop_column("epsilon_budget")
        batch.drop_column("delta")
        batch.drop_column("epsilon_spent")
        batch.drop_column("epsilon_committed")


def downgrade() -> None:
    raise NotImplementedError(
        "0005 moves budgets into budget groups; restore a backup taken before upgrading"
    )
