"""The files use cases: JSONL validation at upload, storage under ``DPRC_DATA_DIR/files``,
reads, deletion, downloads, and a data set's budget (its rules are :mod:`service.budget.budget`'s,
the
grouping of uploads that share examples :mod:`service.data.budget_groups`'). Reads return
:class:`DataSet` (the row and the budget it shows). Each act is authorized
(:mod:`service.governance.roles`) and audited (:mod:`service.governance.audit`) here."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, NotFound, PermissionDenied, TooLarge
from service.base.ids import new_id
from service.base.pagination import cursor_page
from service.budget import budget
from service.data import hash_recordings, near_copies
from service.data.budget_groups import (
    BudgetWish,
    Placement,
    group_examples,
    groups_shared,
    held_bitmap,
    insert_digests,
    overlap,
    overlap_report,
    place,
)
from service.data.example_hashes import HashedData, hash_file, save_digests, tenant_secret
from service.data.file_storage import RESULT_PURPOSE, clean_filename, storage_dir
from service.data.private_data import remove_run_folders, remove_token_stores
from service.data.user_groups import user_overlap
from service.governance import audit
from service.governance.audit import Act
from service.governance.keys import Caller
from service.governance.roles import Action, allowed, authorize
from service.store.db import locked_session
from service.store.job_status import ACTIVE
from service.store.store import Store
from service.store.tables import (
    BudgetGroup,
    Checkpoint,
    File,
    Job,
    Tenant,
    Upload,
    validation_file_id,
)

UPLOAD_PURPOSES = ("fine-tune",)
# a file's approval (service/data/approvals.py)
APPROVED, PENDING, REJECTED = "approved", "pending", "rejected"
REASON_MAX = 1000


# -- JSONL ------------------------------------------------------------------------------------


def read_capped(stream: IO[bytes], cap: int) -> bytes:
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise TooLarge(
            f"file exceeds the upload limit of {cap} bytes", param="file", code="file_too_large"
        )
    return data


# -- objects --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSet:
    """A file as a read shows it: its row, the budget group of a fine-tune data set and the
    budget it shows (None: it has none). ``joined`` (uploads only): the upload joined an
    existing group; ``defaulted``: its budget is the tenant's default."""

    row: File
    group_id: str | None
    budget: budget.Budget | None
    joined: bool | None = None
    defaulted: bool | None = None


def _shown(f: File, group: BudgetGroup | None, live: float | None = None) -> DataSet:
    return DataSet(
        f, group.id if group else None, budget.group_budget(group, live) if group else None
    )


def _read_object(session: Session, f: File) -> DataSet:
    """A read's data set: ``spent`` composed from the steps its group's jobs ran so far."""
    group = budget.group_of(session, f)
    if group is None or group.epsilon_budget is None or group.delta is None:
        return _shown(f, group)
    return _shown(f, group, budget.live_spent(session, group))


# -- upload -----------------------------------------------------------------------------------


def check_purpose(purpose: str) -> None:
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidInput(
            f"purpose must be one of {UPLOAD_PURPOSES}, got {purpose[:40]!r}",
            param="purpose",
            code="invalid_value",
        )


USER_FIELD = re.compile(r"[A-Za-z0-9_.-]{1,64}")
LINE_FIELDS = ("text", "label", "messages", "prompt", "completion")


def check_user_field(user_field: str | None, param: str = "user_field") -> None:
    """A user field names a line's field other than the example's own (1-64 of A-Z a-z 0-9
    _ . -)."""
    if user_field is None:
        return
    if not USER_FIELD.fullmatch(user_field) or user_field in LINE_FIELDS:
        raise InvalidInput(
            f"user_field must be a field name of 1-64 characters A-Z a-z 0-9 _ . - other than "
            f"{', '.join(LINE_FIELDS)}, got {user_field[:40]!r}",
            param=param,
            code="invalid_value",
        )


def create_file(
    store: Store,
    caller: Caller,
    data: bytes,
    filename: str | None,
    purpose: str,
    wish: BudgetWish,
    *,
    user_field: str | None = None,
) -> DataSet:
    """Validate and store a one-shot upload (``POST /v1/files``): :func:`store_data_set` of
    the data written to a temporary file of the tenant's folder."""
    authorize(caller, Action.UPLOAD)
    check_purpose(purpose)
    check_user_field(user_field)
    directory = storage_dir(store, caller.tenant_id)
    fd, name = tempfile.mkstemp(dir=directory, prefix=".upload-")
    source = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return store_data_set(store, caller, source, filename, purpose, wish, user_field=user_field)
    finally:
        source.unlink(missing_ok=True)  # moved into place, or refused


def store_data_set(
    store: Store,
    caller: Caller,
    source: Path,
    filename: str | None,
    purpose: str,
    wish: BudgetWish,
    *,
    max_line_bytes: int | None = None,
    spill_dir: Path | None = None,
    reserved: bool = False,
    within: Callable[[Session, File], None] | None = None,
    audit_detail: dict[str, Any] | None = None,
    user_field: str | None = None,
    upload_id: str | None = None,
) -> DataSet:
    """Validate a data set on disk (``source``, in the tenant's folder; it is moved into place
    when accepted) and store it as a file; a fine-tune data set goes to its budget group
    (:func:`service.data.budget_groups.place`): a new one with the budget it names (or the tenant's
    default), or the existing group it shares examples with.

    The file is read line by line (:func:`service.data.example_hashes.hash_file`: lines of at most
    ``max_line_bytes``, its digests spilled to ``spill_dir``, default the tenant's folder), so
    memory does not grow with its size. ``reserved``: its bytes already count towards the
    tenant's storage (a completing upload, :mod:`service.data.uploads`), so the quota is not checked
    again. ``within(session, row)`` runs in the transaction that stores the file, under the
    tenant's lock, before its audit entries (the last lock taken); ``audit_detail`` is added
    to the detail of its ``file.upload`` entry. ``user_field``: the field naming each line's
    user (user-level DP; :func:`service.data.example_hashes.hash_file`). ``upload_id``: the
    upload of the Uploads API it completes; with ``reserved``, a big one's hashes are
    recorded in short transactions (:mod:`service.data.hash_recordings`)."""
    authorize(caller, Action.UPLOAD)
    check_purpose(purpose)
    directory = storage_dir(store, caller.tenant_id)
    size = source.stat().st_size
    secret = tenant_secret(store.settings.data_dir, caller.tenant_id)
    check_user_field(user_field)
    folder = spill_dir or directory
    with store.sessions() as session:
        tenant = session.get(Tenant, caller.tenant_id)
        legacy = bool(tenant is not None and tenant.legacy_hashes)
        trainers = bool(tenant is not None and tenant.trainers_set_budgets)
    with hash_file(source, secret, folder, max_line_bytes, user_field, legacy) as hashed:
        near = None
        if not wish.unbudgeted and not (allowed(caller.role, Action.SET_BUDGET) or trainers):
            # it will wait for a data owner: its near copies are found before the tenant's
            # lock, which other uploads of the tenant wait for (seconds for 20,000 lines)
            with store.sessions() as session:
                near = near_copies.of_upload(
                    session, caller.tenant_id, source, hashed.users.field if hashed.users else None
                )
        file_id = new_id("file")
        path = directory / f"{file_id}.jsonl"
        os.replace(source, path)
        try:
            if (
                reserved
                and upload_id is not None
                and hashed.users is None
                and len(hashed.digests) >= hash_recordings.BATCHED_MIN
            ):
                return _insert_batched(
                    store,
                    caller,
                    path,
                    size,
                    filename,
                    purpose,
                    wish,
                    hashed,
                    within,
                    audit_detail or {},
                    near,
                    upload_id,
                )
            for attempt in range(BUSY_ATTEMPTS):
                hash_recordings.wait_until_free(store, caller.tenant_id)
                try:
                    return _insert_data_set(
                        store,
                        caller,
                        path,
                        size,
                        filename,
                        purpose,
                        wish,
                        hashed,
                        reserved,
                        within,
                        audit_detail or {},
                        near,
                    )
                except hash_recordings.RecordingBusy:
                    if attempt == BUSY_ATTEMPTS - 1:
                        raise
            raise AssertionError("unreachable")
        except BaseException:
            path.unlink(missing_ok=True)
            raise


BUSY_ATTEMPTS = 3  # a recording's lease taken between the wait and the tenant's lock: wait again


def _insert_batched(
    store: Store,
    caller: Caller,
    path: Path,
    size: int,
    filename: str | None,
    purpose: str,
    wish: BudgetWish,
    hashed: HashedData,
    within: Callable[[Session, File], None] | None,
    audit_detail: dict[str, Any],
    near: near_copies.NearCopies | None,
    upload_id: str,
) -> DataSet:
    """:func:`_insert_data_set` of a big upload of the Uploads API (its bytes reserved), its
    hashes recorded in short transactions under the tenant's lease (the four steps of
    :mod:`service.data.hash_recordings`); an upload that waits for a data owner records no
    hash and is stored as :func:`_insert_data_set` stores it."""
    token = None
    for attempt in range(BUSY_ATTEMPTS):  # 1. the lease
        hash_recordings.wait_until_free(store, caller.tenant_id)
        try:
            token = _lease(store, caller, wish, hashed, path.stem, upload_id)
            break
        except hash_recordings.RecordingBusy:
            if attempt == BUSY_ATTEMPTS - 1:
                raise
    if token is None:  # it waits for a data owner: no hash is recorded
        return _insert_data_set(
            store,
            caller,
            path,
            size,
            filename,
            purpose,
            wish,
            hashed,
            True,
            within,
            audit_detail,
            near,
        )
    try:
        return _record_batched(
            store, caller, path, size, filename, purpose, wish, hashed, within, audit_detail, token
        )
    except BaseException:
        hash_recordings.rollback(store, caller.tenant_id, token)
        raise


def _lease(
    store: Store,
    caller: Caller,
    wish: BudgetWish,
    hashed: HashedData,
    file_id: str,
    upload_id: str,
) -> str | None:
    """Step 1: the tenant's lease for recording ``file_id`` (its token), or None when the
    upload waits for a data owner (it records no hash)."""
    with locked_session(store.sessions) as session:
        session.get(Tenant, caller.tenant_id, with_for_update=True)
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        if waits_for_approval(
            caller,
            tenant,
            wish,
            store.settings,
            lambda: bool(overlap(session, caller.tenant_id, hashed)),
        ):
            return None
        token = hash_recordings.acquire(session, caller.tenant_id, file_id, upload_id).token
        session.commit()
        return token


def _record_batched(
    store: Store,
    caller: Caller,
    path: Path,
    size: int,
    filename: str | None,
    purpose: str,
    wish: BudgetWish,
    hashed: HashedData,
    within: Callable[[Session, File], None] | None,
    audit_detail: dict[str, Any],
    token: str,
) -> DataSet:
    """Steps 2 to 4 of :mod:`service.data.hash_recordings`, under the lease ``token``."""
    tenant_id, digests = caller.tenant_id, hashed.digests
    with store.sessions() as session:  # 2. the placement: looked up outside the write lock
        found = groups_shared(session, tenant_id, hashed)
    with locked_session(store.sessions) as session:
        session.get(Tenant, tenant_id, with_for_update=True)
        lease = hash_recordings.own(session, tenant_id, token)
        placed = place(
            session, tenant_id, hashed, wish, store.settings, found=found, record=False, token=token
        )
        group_id, joined = placed.group.id, placed.joined
        lease.group_id, lease.new_group = group_id, not joined
        before = group_examples(session, group_id) if joined else 0
        session.commit()
    held = None
    if joined:  # the digests the tenant holds (in this group: the others refused it)
        with store.sessions() as session:
            held = held_bitmap(session, tenant_id, digests)

    def insert(session: Session, start: int, stop: int) -> int:
        return insert_digests(session, tenant_id, group_id, digests, held, start, stop)

    # 3. the hashes: only SQLite's writers wait for a recording's transactions (its one write
    # lock: a pause after each); on PostgreSQL the other tenants' writes take other rows'
    # locks, and the recording writes on WRITERS connections at once
    added = hash_recordings.write_batches(
        store, tenant_id, token, len(digests), insert, hash_recordings.WRITERS
    )
    with locked_session(store.sessions) as session:  # 4. the file
        session.get(Tenant, tenant_id, with_for_update=True)
        lease = hash_recordings.own(session, tenant_id, token)
        group = budget.lock_group(session, group_id)
        group.n_examples = max(before + added, group.n_examples, hashed.n_examples)
        row = _file_row(caller, path, size, filename, purpose, hashed, wish)
        row.group_id = group.id
        session.add(row)
        session.flush()
        if within is not None:
            within(session, row)
        shown = _shown(row, group)
        _audit_upload(session, caller, row, group, placed, audit_detail)
        session.delete(lease)
        session.commit()
        return DataSet(
            row, shown.group_id, shown.budget, joined=placed.joined, defaulted=placed.defaulted
        )


def _insert_data_set(
    store: Store,
    caller: Caller,
    path: Path,
    size: int,
    filename: str | None,
    purpose: str,
    wish: BudgetWish,
    hashed: HashedData,
    reserved: bool,
    within: Callable[[Session, File], None] | None,
    audit_detail: dict[str, Any],
    near: near_copies.NearCopies | None = None,
) -> DataSet:
    with locked_session(store.sessions) as session:
        # lock order: tenant, then group, then the audit head
        if reserved:
            session.get(Tenant, caller.tenant_id, with_for_update=True)
        else:
            check_quota(session, caller, size, store.settings.tenant_storage_bytes)
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        if waits_for_approval(
            caller,
            tenant,
            wish,
            store.settings,
            lambda: (
                bool(overlap(session, tenant.id, hashed))
                or bool(user_overlap(session, tenant.id, hashed))
            ),
        ):
            return _insert_pending(
                session,
                caller,
                path,
                size,
                filename,
                purpose,
                wish,
                hashed,
                within,
                audit_detail,
                near,
            )
        placed = place(session, caller.tenant_id, hashed, wish, store.settings)
        group = placed.group
        row = _file_row(caller, path, size, filename, purpose, hashed, wish)
        row.group_id = group.id
        session.add(row)
        session.flush()
        if within is not None:
            within(session, row)
        shown = _shown(row, group)  # stored totals: no live read cached here
        _audit_upload(session, caller, row, group, placed, audit_detail)
        session.commit()
        return DataSet(
            row,
            shown.group_id,
            shown.budget,
            joined=placed.joined,
            defaulted=placed.defaulted,
        )


def _audit_upload(
    session: Session,
    caller: Caller,
    row: File,
    group: BudgetGroup,
    placed: Placement,
    audit_detail: dict[str, Any],
) -> None:
    """The audit entries of a stored upload: ``file.upload``, and ``budget.set`` when it set
    a new group's budget."""
    audit.record(
        session,
        caller,
        Act.FILE_UPLOAD,
        row.id,
        {
            "filename": row.filename,
            "bytes": row.bytes,
            "n_examples": row.n_examples,
            "n_users": row.n_users,
            "budget_group": group.id,
            "joined": placed.joined,
            **audit_detail,
        },
    )
    if placed.budget_set:
        audit.record(
            session,
            caller,
            Act.BUDGET_SET,
            group.id,
            {
                "file_id": row.id,
                "epsilon": group.epsilon_budget,
                "delta": group.delta,
                "default": placed.defaulted,
            },
        )


def waits_for_approval(
    caller: Caller,
    tenant: Tenant,
    wish: BudgetWish,
    settings: Any,
    shares: Callable[[], bool],
) -> bool:
    """Whether an upload waits for a data owner's approval (:mod:`service.data.approvals`) rather
    than going to its budget group at once. Only a data owner (or an admin) sets a new data
    set's budget, or a trainer where the tenant lets trainers budget their own uploads; their
    upload goes to its group when it names a budget, when one applies without being named
    (the tenant's default, or no budget required by the server's policy), or when it shares
    examples with an existing group (``shares()``: it joins that budget). Everything else
    waits — a trainer's upload, and an upload of new data that names no budget where one is
    required (the Uploads API's parts without extra fields). Validation-only data
    (``unbudgeted``) mints no budget and is stored at once."""
    if wish.unbudgeted:
        return False
    if not (allowed(caller.role, Action.SET_BUDGET) or tenant.trainers_set_budgets):
        return True
    applies = settings.default_epsilon_budget is not None or not settings.require_budget
    return not (wish.named or applies or shares())


def pending_digests(path: Path) -> tuple[Path, Path, Path, Path]:
    """Where a pending upload's digests wait for the owner's decision, beside its content
    (sorted records, 0600): its examples' (canonical key), their raw-text ones (tenants with
    legacy hashes), its users' and its (example, user) pairs (per-user data)."""
    return (
        path.with_suffix(".digests"),
        path.with_suffix(".raw-digests"),
        path.with_suffix(".user-digests"),
        path.with_suffix(".pair-digests"),
    )


def _file_row(
    caller: Caller,
    path: Path,
    size: int,
    filename: str | None,
    purpose: str,
    hashed: HashedData,
    wish: BudgetWish,
) -> File:
    return File(
        id=path.stem,
        tenant_id=caller.tenant_id,
        filename=clean_filename(filename),
        purpose=purpose,
        bytes=size,
        created_at=now(),
        storage_path=str(path),
        n_examples=hashed.n_examples,
        data_format=hashed.format,
        user_field=hashed.users.field if hashed.users else None,
        n_users=hashed.users.n_users if hashed.users else None,
        max_lines_per_user=hashed.users.max_lines_per_user if hashed.users else None,
        group_id=None,
        unbudgeted=wish.unbudgeted,
        deleted=False,
        created_by=caller.key_id,
    )


def _insert_pending(
    session: Session,
    caller: Caller,
    path: Path,
    size: int,
    filename: str | None,
    purpose: str,
    wish: BudgetWish,
    hashed: HashedData,
    within: Callable[[Session, File], None] | None = None,
    audit_detail: dict[str, Any] | None = None,
    near: near_copies.NearCopies | None = None,
) -> DataSet:
    """Store an upload that waits for a data owner: its row without a group, the budget it
    asked for, the overlap report, its digests beside its content (removed on any failure)."""
    paths = pending_digests(path)
    try:
        kept = (hashed.digests, hashed.legacy_digests, hashed.user_digests, hashed.pairs)
        for digests, target in zip(kept, paths, strict=True):
            if digests is not None:
                save_digests(digests, target)
        row = _file_row(caller, path, size, filename, purpose, hashed, wish)
        row.approval = PENDING
        row.requested_budget = (
            {"epsilon": wish.epsilon_budget, "delta": wish.delta} if wish.named else None
        )
        row.overlap_report = near_copies.with_near_copies(
            session,
            caller.tenant_id,
            path,
            hashed.users.field if hashed.users else None,
            overlap_report(session, caller.tenant_id, hashed),
            near,
        )
        session.add(row)
        session.flush()
        if within is not None:
            within(session, row)
        audit.record(
            session,
            caller,
            Act.FILE_UPLOAD,
            row.id,
            {
                "filename": row.filename,
                "bytes": row.bytes,
                "n_examples": row.n_examples,
                "n_users": row.n_users,
                "approval": PENDING,
                "requested_budget": row.requested_budget,
                **(audit_detail or {}),
            },
        )
        session.commit()
    except BaseException:
        for target in paths:
            target.unlink(missing_ok=True)
        raise
    return DataSet(row, None, None)


def storage_used(session: Session, tenant_id: int) -> int:
    """Bytes held by the tenant's files that are not deleted (uploads and archives), and the
    bytes reserved by its pending uploads of the Uploads API (announced at their creation;
    an expired one no longer counts, one being completed does)."""
    used = session.scalar(
        select(func.coalesce(func.sum(File.bytes), 0)).where(
            File.tenant_id == tenant_id, File.deleted.is_(False)
        )
    )
    reserved = session.scalar(
        select(func.coalesce(func.sum(Upload.bytes), 0)).where(
            Upload.tenant_id == tenant_id,
            Upload.status == "pending",
            or_(Upload.expires_at > now(), Upload.completing_at.is_not(None)),
        )
    )
    return int(used or 0) + int(reserved or 0)


@dataclass(frozen=True)
class Storage:
    used_bytes: int
    quota_bytes: int


def storage(store: Store, caller: Caller) -> Storage:
    """The caller's tenant's storage: bytes its files hold (uploads and archives, deleted
    files excluded) and its pending uploads reserve, and the quota of
    ``DPRC_TENANT_STORAGE_BYTES``."""
    authorize(caller, Action.READ)
    with store.sessions() as session:
        used = storage_used(session, caller.tenant_id)
    return Storage(used, store.settings.tenant_storage_bytes)


def check_quota(
    session: Session, caller: Caller, size: int, quota: int, param: str = "file"
) -> None:
    """Refuse an upload of ``size`` bytes that would take the tenant beyond ``quota``; under
    the tenant's lock (its row FOR UPDATE on PostgreSQL; the write lock on SQLite), so
    concurrent uploads are counted one after the other."""
    session.get(Tenant, caller.tenant_id, with_for_update=True)
    used = storage_used(session, caller.tenant_id)
    if used + size > quota:
        raise TooLarge(
            f"storage quota exceeded: this tenant's files and pending uploads hold {used} "
            f"bytes, this upload of {size} bytes would bring them beyond the quota of {quota} "
            "bytes; delete files (GET /v1/files, DELETE /v1/files/{id}) or cancel uploads "
            "(POST /v1/uploads/{id}/cancel) to make room",
            param=param,
            code="storage_quota_exceeded",
        )


def required_reason(reason: str | None, act: str) -> str:
    """The reason an audited act gives (1 to REASON_MAX characters, trimmed), else 400."""
    text = (reason or "").strip()
    if not text or len(text) > REASON_MAX:
        raise InvalidInput(
            f"{act} needs a reason of 1 to {REASON_MAX} characters",
            param="reason",
            code="invalid_value",
        )
    return text


# -- reads ------------------------------------------------------------------------------------


def pending_approval(row: File, param: str) -> Conflict:
    """409 ``pending_approval``: the file waits for a data owner's decision."""
    asked = row.requested_budget or {}
    eps = asked.get("epsilon")
    wanted = f" (its uploader asked for epsilon={eps:g})" if eps else ""
    return Conflict(
        f"file {row.id} is pending approval{wanted}: a data owner (a data_owner or admin key "
        f"of the tenant) approves it first: POST /v1/files/{row.id}/approve (dprc files "
        "approve), or rejects it",
        param=param,
        code="pending_approval",
    )


def _not_found(file_id: str) -> NotFound:
    return NotFound(f"no such file: {file_id[:64]!r}", param="file_id", code="file_not_found")


def get_row(
    session: Session, caller: Caller, file_id: str, *, deleted: bool = False, lock: bool = False
) -> File:
    """The caller's file (a deleted one too when ``deleted``), its row locked when ``lock``."""
    query = select(File).where(File.id == file_id, File.tenant_id == caller.tenant_id)
    if not deleted:
        query = query.where(File.deleted.is_(False))
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise _not_found(file_id)
    return row


def retrieve(store: Store, caller: Caller, file_id: str) -> DataSet:
    """A file; a deleted data set still shows its budget, spent ε and group."""
    authorize(caller, Action.READ)
    with store.sessions() as session:
        return _read_object(session, get_row(session, caller, file_id, deleted=True))


def list_files(
    store: Store,
    caller: Caller,
    purpose: str | None,
    limit: int,
    after: str | None,
    order: str,
    include_deleted: bool = False,
    approval: str | None = None,
) -> tuple[list[DataSet], bool]:
    """A page of the tenant's files; ``approval``: only those in that state (``pending``: a
    data owner's queue)."""
    authorize(caller, Action.READ)
    if approval is not None and approval not in (APPROVED, PENDING, REJECTED):
        raise InvalidInput(
            f"approval must be one of {APPROVED}, {PENDING}, {REJECTED}; got {approval[:40]!r}",
            param="approval",
            code="invalid_value",
        )
    with store.sessions() as session:
        q = select(File).where(File.tenant_id == caller.tenant_id)
        if not include_deleted and approval != REJECTED:
            q = q.where(File.deleted.is_(False))
        if approval is not None:
            q = q.where(File.approval == approval)
        if purpose:
            q = q.where(File.purpose == purpose)
        rows, more = cursor_page(session, q, File, after, limit, "file", descending=order == "desc")
        return [_read_object(session, r) for r in rows], more


def _download_act(session: Session, row: File) -> str:
    if row.purpose != RESULT_PURPOSE:
        return Act.FILE_DOWNLOAD
    is_checkpoint = session.scalar(select(Checkpoint.id).where(Checkpoint.file_id == row.id))
    return Act.CHECKPOINT_DOWNLOAD if is_checkpoint is not None else Act.RESULT_DOWNLOAD


def content_path(store: Store, caller: Caller, file_id: str) -> tuple[Path, str]:
    """Where a file's content is, for a download; the download is audited before it is sent
    (an entry per request, whether or not the client reads the whole body). A synthetic data
    set goes to the roles its data owner shares it with (``synthetic.download_roles``; admin
    always), any other file to the roles that download."""
    authorize(caller, Action.READ)
    with locked_session(store.sessions) as session:
        row = get_row(session, caller, file_id, deleted=True)
        if (row.synthetic or {}).get("download_roles") is None:
            authorize(caller, Action.DOWNLOAD)
        if row.deleted:
            raise NotFound(
                f"file {file_id} was deleted: its content is gone (its budget and history "
                "remain: GET /v1/files/{id})",
                param="file_id",
                code="file_deleted",
            )
        shared = (row.synthetic or {}).get("download_roles")
        if shared is not None and caller.role != "admin" and caller.role not in shared:
            raise PermissionDenied(
                f"the data owner shares synthetic data set {row.id} with the roles "
                f"{', '.join(['admin', *shared])} only"
            )
        path = Path(row.storage_path)
        if not path.exists():
            raise NotFound(
                f"the content of file {file_id} is gone", param="file_id", code="file_not_found"
            )
        audit.record(session, caller, _download_act(session, row), row.id, {"bytes": row.bytes})
        session.commit()
        return path, row.filename


# -- delete -----------------------------------------------------------------------------------


def delete(store: Store, caller: Caller, file_id: str) -> str:
    """Remove a file's content. Its row stays, marked deleted, with its example hashes and
    its budget group: the privacy record survives, and a re-upload of the same data rejoins
    the group with its spent ε."""
    authorize(caller, Action.DELETE_FILE)
    with locked_session(store.sessions) as session:
        row = get_row(session, caller, file_id, lock=True)
        active = session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.training_file_id == row.id, Job.status.in_(ACTIVE))
        )
        active = (active or 0) + sum(  # jobs that score valid_loss on it
            validation_file_id(job) == row.id
            for job in session.scalars(
                select(Job).where(Job.tenant_id == caller.tenant_id, Job.status.in_(ACTIVE))
            )
        )
        if active:
            raise Conflict(
                f"file {file_id} is used by {active} active fine-tuning job(s); cancel them first",
                param="file_id",
                code="file_in_use",
            )
        row.deleted = True
        row.deleted_at = now()
        row.overlap_report = near_copies.without_texts(row.overlap_report)
        path = Path(row.storage_path)
        jobs = list(session.scalars(select(Job.id).where(Job.training_file_id == row.id)))
        audit.record(session, caller, Act.FILE_DELETE, row.id, {"budget_group": row.group_id})
        session.commit()
    remove_token_stores(store.settings.data_dir, caller.tenant_id, path)  # before its content
    path.unlink(missing_ok=True)
    for digests in pending_digests(path):  # a pending upload's (it never joined a group)
        digests.unlink(missing_ok=True)
    remove_run_folders(store.settings.data_dir, jobs)  # what was derived from it
    return file_id


# -- budget -----------------------------------------------------------------------------------


def _data_set_group(session: Session, caller: Caller, file_id: str) -> tuple[File, BudgetGroup]:
    """The file (deleted ones too) and its budget group, the group's row locked."""
    row = get_row(session, caller, file_id, deleted=True)
    if row.approval == PENDING:
        raise pending_approval(row, "file_id")
    if row.purpose not in UPLOAD_PURPOSES or row.group_id is None:
        raise InvalidInput(
            "only fine-tune data sets carry a budget", param="file_id", code="invalid_value"
        )
    return row, budget.lock_group(session, row.group_id)


def set_budget(
    store: Store,
    caller: Caller,
    file_id: str,
    epsilon_budget: float | None,
    delta: float | None,
    reason: str | None,
) -> DataSet:
    """Change the budget of a file's data set (its whole group) — an admin's act, with a
    reason, audited with the budget before and after. A value not given keeps the current
    one. Refused (:class:`Conflict`) if what is already committed does not fit the new one
    (:func:`service.budget.budget.change_budget`)."""
    authorize(caller, Action.CHANGE_BUDGET)
    with locked_session(store.sessions) as session:
        session.get(Tenant, caller.tenant_id, with_for_update=True)  # lock order: tenant first
        row, group = _data_set_group(session, caller, file_id)
        reason = required_reason(reason, "a budget change")
        if epsilon_budget is None and delta is None:
            raise InvalidInput(
                "name epsilon_budget, delta or both", param="epsilon_budget", code="invalid_value"
            )
        change = budget.change_budget(session, group, epsilon_budget, delta)
        audit.record(
            session,
            caller,
            Act.BUDGET_CHANGE,
            group.id,
            {
                "file_id": row.id,
                "before": {"epsilon": change.before[0], "delta": change.before[1]},
                "after": {"epsilon": change.after[0], "delta": change.after[1]},
                "reason": reason,
            },
        )
        session.commit()
        return _shown(row, group)


def budget_history(store: Store, caller: Caller, file_id: str) -> budget.History:
    """The composed ε of the file's data set (its group) after each of its jobs, in creation
    order (:func:`service.budget.budget.history`); a deleted file's too."""
    authorize(caller, Action.READ)
    with store.sessions() as session:
        row = get_row(session, caller, file_id, deleted=True)
        group = budget.group_of(session, row)
        if group is None:
            raise InvalidInput(
                "only fine-tune data sets have a budget history",
                param="file_id",
                code="invalid_value",
            )
        return budget.history(session, group)
