"""The store's tables (SQLAlchemy 2). Migrations live in ``service/migrations``.

A job's row is the truth about the job. The lease columns (``lease_owner``,
``lease_expires_at``, ``heartbeat_at``) let a worker own a job; ``steps_done`` and
``epsilon_spent`` are written by the worker as steps run, and a job's privacy reservation is
its planned event minus what ran (see ``service/budget/budget.py``).
"""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # policy: trainers may budget their own uploads (off: a trainer's upload waits for a data
    # owner's approval; service/data/approvals.py). Set by an admin, audited.
    trainers_set_budgets: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    # how its example hashes are keyed: 1 the raw text, 2 the canonical key
    # (service/data/example_hashes.py::canonical_text); service/data/rekey.py moves 1 to 2 at
    # start-up
    hash_version: Mapped[int] = mapped_column(Integer, default=2, server_default="1")
    # some raw-text hashes could not be re-keyed (their file's content is gone): uploads are
    # also looked up by their raw-text hashes
    legacy_hashes: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # admin | data_owner | trainer | viewer (service/governance/roles.py); keys made before roles
    # existed
    # are admins
    role: Mapped[str] = mapped_column(String(16), default="trainer", server_default="admin")
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # the key that created it over HTTP (None: created on the server's shell)
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(40), nullable=True)


class BudgetGroup(Base):
    """One data set's privacy budget, shared by every upload that holds any of its examples
    (``ExampleHash``): its committed ε composes the jobs of all the group's files."""

    __tablename__ = "budget_groups"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # distinct examples of the group's files (the N of the δ ≤ 1/N rule)
    n_examples: Mapped[int] = mapped_column(BigInteger)
    # None: no budget (allowed only by tenant policy, or for validation-only data)
    epsilon_budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    delta: Mapped[float | None] = mapped_column(Float, nullable=True)
    # cached composition results, recomputed under the group's lock whenever events change
    epsilon_spent: Mapped[float] = mapped_column(Float, default=0.0)
    epsilon_committed: Mapped[float] = mapped_column(Float, default=0.0)
    # frozen (no new job) until an admin acknowledges it: set by a restore when jobs ran on
    # the group after the backup (service/admin/restore.py, service/budget/freezes.py)
    frozen_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    frozen_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # what its ε protects: "example" (a line) or "user" (all of a user's lines; its files
    # name their users): set by its first file, and every file that joins it has the same
    privacy_unit: Mapped[str] = mapped_column(
        String(16), default="example", server_default="example"
    )


class ExampleHash(Base):
    """The keyed hash (HMAC-SHA256 with the tenant's secret) of one canonical example, and the
    budget group it belongs to. Kept when its file is deleted."""

    __tablename__ = "example_hashes"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    # no foreign keys (migration 0017): at 10⁷ rows an upload their checks were two thirds of
    # PostgreSQL's recording; ``dprc admin check`` finds a row of an unknown tenant or group
    tenant_id: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(String(40), index=True)

    __table_args__ = (UniqueConstraint("tenant_id", "digest", name="uq_example_hash"),)


class ExampleUser(Base):
    """A line of a per-user data set: its example's keyed hash and its user's (keyed over the
    field naming users and the id), and the budget group holding them. A group's lines keep
    their users (a re-upload may not rename, split or merge them), and an upload naming a
    person the group holds joins it (service/data/user_groups.py)."""

    __tablename__ = "example_users"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(Integer)  # no foreign keys, as ``ExampleHash``
    digest: Mapped[str] = mapped_column(String(64))
    user_digest: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(String(40), index=True)

    __table_args__ = (
        UniqueConstraint("tenant_id", "digest", "user_digest", name="uq_example_user"),
        Index("ix_example_users_user", "tenant_id", "user_digest"),
    )


class TokenHash(Base):
    """The keyed hash (HMAC-SHA256 with the tenant's secret, service/data/token_hashes.py) of one
    token-id sequence a job of the budget group trained on, for one tokenizer (its
    fingerprint, dprc_core/training/token_store.py): a copy whose text the canonical key calls
    new but which tokenizes exactly the same is found by it. Kept when its file is deleted."""

    __tablename__ = "token_hashes"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    tokenizer: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(ForeignKey("budget_groups.id"), index=True)

    __table_args__ = (UniqueConstraint("tenant_id", "tokenizer", "digest", name="uq_token_hash"),)


class LegacyExampleHash(Base):
    """A raw-text hash (before the canonical key) whose file's content was gone when the tenant
    was re-keyed (service/data/rekey.py): uploads are still looked up by it, so a re-upload of that
    data finds its group. Never added to."""

    __tablename__ = "legacy_example_hashes"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    digest: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(ForeignKey("budget_groups.id"), index=True)

    __table_args__ = (UniqueConstraint("tenant_id", "digest", name="uq_legacy_example_hash"),)


class HashRecording(Base):
    """A big upload's example hashes being recorded in short transactions
    (:mod:`service.data.hash_recordings`): at most one a tenant. While it exists no other upload
    of the tenant is placed in a budget group; one whose ``beat_at`` is old is taken for dead
    and rolled back (the hashes above ``base_id`` of its group deleted, a group it made
    removed), so that no file is stored with half its hashes."""

    __tablename__ = "hash_recordings"

    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    token: Mapped[str] = mapped_column(String(40))  # this recording (a holder checks it is its)
    file_id: Mapped[str] = mapped_column(String(40))  # the file it records (no row until done)
    upload_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    group_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    new_group: Mapped[bool] = mapped_column(Boolean, default=False)
    base_id: Mapped[int] = mapped_column(BigInteger)  # the largest example_hashes.id before it
    started_at: Mapped[int] = mapped_column(BigInteger)
    beat_at: Mapped[int] = mapped_column(BigInteger)


class AuditEntry(Base):
    """One act in a tenant's append-only audit log; ``hash`` chains it to the previous entry
    (service/governance/audit.py)."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    created_at: Mapped[int] = mapped_column(BigInteger)
    key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    action: Mapped[str] = mapped_column(String(48))
    resource: Mapped[str | None] = mapped_column(String(64), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[str] = mapped_column(Text)  # canonical JSON, hashed as stored
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_audit_tenant_seq", "tenant_id", "seq"),
        # one successor per entry: the chain never forks, whatever the concurrency
        UniqueConstraint("tenant_id", "prev_hash", name="uq_audit_chain"),
    )


class AuditHead(Base):
    """The last entry of a tenant's audit chain; its row is the chain's lock, always taken
    last in a transaction (after every other row lock), so it joins no lock cycle."""

    __tablename__ = "audit_heads"

    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    last_hash: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(BigInteger, default=0)


class DashboardSession(Base):
    """A signed-in dashboard session: its cookie holds a random token whose SHA-256 is
    ``token_hash``; sign-out ends it here, so an old cookie is refused."""

    __tablename__ = "dashboard_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class File(Base):
    __tablename__ = "files"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    storage_path: Mapped[str] = mapped_column(String(512))
    # data-set facts (purpose fine-tune): number of examples and line format
    n_examples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # 32 characters (migration 0013); SQLite keeps its VARCHAR(16), whose length it does not
    # enforce (widening it there would rebuild ``files``, which foreign keys point at)
    data_format: Mapped[str | None] = mapped_column(
        String(32).with_variant(String(16), "sqlite"), nullable=True
    )
    # user-level DP (docs/privacy_unit.md): the field naming each line's user, the number of
    # users (by the worker's user key) and the most lines one of them has; None: no users
    user_field: Mapped[str | None] = mapped_column(String(64), nullable=True)
    n_users: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_lines_per_user: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the budget group of a fine-tune data set (its budget, spent, committed live there)
    group_id: Mapped[str | None] = mapped_column(
        ForeignKey("budget_groups.id"), nullable=True, index=True
    )
    # validation-only data (no budget: no job may train on it)
    unbudgeted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # a data owner's approval (service/data/approvals.py): "approved" (in its budget group),
    # "pending" (no group yet, not trainable), "rejected" (content deleted, record kept)
    approval: Mapped[str] = mapped_column(String(16), default="approved", server_default="approved")
    # what the uploader asked for (pending uploads): {"epsilon", "delta"}; and the overlap
    # report computed at upload (counts per existing budget group)
    requested_budget: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    overlap_report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    decided_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # a synthetic data set's provenance (service/synthetic): its source group, jobs, ε, δ and
    # unit; set only by a synthetic-data job, never by an upload
    synthetic: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Upload(Base):
    """A file uploaded in parts (the OpenAI Uploads API, :mod:`service.data.uploads`): created with
    its announced ``bytes`` (reserved against the tenant's storage quota while pending), its
    parts on disk under ``files/<tenant>/uploads/<id>/``, completed into a ``File``."""

    __tablename__ = "uploads"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    mime_type: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    # pending | completed | cancelled | expired
    status: Mapped[str] = mapped_column(String(16))
    # set while a completion assembles and validates the parts (no part, cancel or other
    # completion meanwhile); back to None when it fails
    completing_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the parts in their order, as the last completion named them (a retry of that completion
    # waits for it, or answers its result)
    part_ids: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # the budget asked for at creation (the upload's extra fields), applied at completion
    epsilon_budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    delta: Mapped[float | None] = mapped_column(Float, nullable=True)
    unbudgeted: Mapped[bool] = mapped_column(Boolean, default=False)
    # the field naming each line's user, as announced at creation (None: ``user_id`` if any)
    user_field: Mapped[str | None] = mapped_column(String(64), nullable=True)
    file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"), nullable=True)
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)

    __table_args__ = (
        Index("ix_uploads_tenant_status", "tenant_id", "status"),
        Index("ix_uploads_status_expires", "status", "expires_at"),
    )


class UploadPart(Base):
    """One part of an upload: its bytes are the file ``<id>`` in the upload's folder."""

    __tablename__ = "upload_parts"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id"), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)


# The validation file's id is kept in the job row's ``hyperparameters`` JSON under this key
# (the jobs table has no column for it yet); the API shows it as the job's
# ``validation_file``, never among its hyperparameters.
VALIDATION_FILE_KEY = "validation_file"


class Job(Base):
    __tablename__ = "jobs"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    model: Mapped[str] = mapped_column(String(128))
    training_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"), index=True)
    status: Mapped[str] = mapped_column(String(24), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(JSON)
    privacy: Mapped[dict[str, Any]] = mapped_column(JSON)  # request + plan, see service/planning
    seed: Mapped[int] = mapped_column(BigInteger)
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    job_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    checkpoint_every: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the privacy plan as columns (the budget check composes these)
    noise_multiplier: Mapped[float] = mapped_column(Float)
    sample_rate: Mapped[float] = mapped_column(Float)
    steps_total: Mapped[int] = mapped_column(Integer)
    # the accountant's envelope family (exact | hutch | hutchpp); column of its earlier name
    accounting_envelope: Mapped[str] = mapped_column("accounting_clipping", String(16))
    accounting_k: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # how the randomized clipping's projections were drawn, as accounted: shared (the
    # revealed-scale model; every job before migration 0004) | per_example (hidden-scale)
    accounting_sketch: Mapped[str] = mapped_column(
        String(16), default="shared", server_default="shared"
    )
    # progress, written by the worker
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    epsilon_spent: Mapped[float] = mapped_column(Float, default=0.0)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    result_files: Mapped[list[str]] = mapped_column(JSON, default=list)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    pause_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # lease of the worker that runs the job
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    devices: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # a node
    # hosts it trains on: nodes × devices ranks, through Ray when > 1 (migration 0015)
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # how its ranks hold the model: "none" (each the whole model; every job before migration
    # 0009) or "fsdp" (FSDP2-sharded over its devices)
    sharding: Mapped[str] = mapped_column(String(16), default="none", server_default="none")
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)

    __table_args__ = (Index("ix_jobs_tenant_seq", "tenant_id", "seq"),)

    @property
    def accounting_clipping(self) -> str:
        """Deprecated name of :attr:`accounting_envelope`."""
        warnings.warn(
            "Job.accounting_clipping is deprecated; use Job.accounting_envelope",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.accounting_envelope

    @accounting_clipping.setter
    def accounting_clipping(self, value: str) -> None:
        warnings.warn(
            "Job.accounting_clipping is deprecated; use Job.accounting_envelope",
            DeprecationWarning,
            stacklevel=2,
        )
        self.accounting_envelope = value


class JobEvent(Base):
    __tablename__ = "job_events"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    level: Mapped[str] = mapped_column(String(8))
    type: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(Integer)
    epsilon: Mapped[float] = mapped_column(Float)
    file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("tenant_id", "key", name="uq_idempotency_tenant_key"),)


def validation_file_id(job: Job) -> str | None:
    value = (job.hyperparameters or {}).get(VALIDATION_FILE_KEY)
    return str(value) if value is not None else None


class SyntheticJob(Base):
    """A synthetic-data job (docs/synthetic.md): generate ``n`` records from the ``ft:`` model
    of ``source_job_id`` (a succeeded job, or one this job created from its training file).
    ``privacy`` holds the label histogram's planned ``event`` (None when labels are public),
    ``released`` (the histogram, once drawn: then it is spent), the group's ``delta`` and the
    data set's composed ``epsilon``; ``spec`` the format, labels, prompts and sampling. The
    lease columns work as a job's."""

    __tablename__ = "synthetic_jobs"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    status: Mapped[str] = mapped_column(String(24), index=True)
    source_job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    training_file_id: Mapped[str] = mapped_column(String(40))  # the source job's
    group_id: Mapped[str] = mapped_column(ForeignKey("budget_groups.id"), index=True)
    holdout_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    n: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    privacy: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(BigInteger)
    records_done: Mapped[int] = mapped_column(Integer, default=0)
    # 1 once the label histogram was drawn (a release counted as one step): what backups and
    # ledger files compare, as a job's steps_done
    steps_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    result_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    events: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (Index("ix_synthetic_jobs_tenant_seq", "tenant_id", "seq"),)
