"""The uploads use cases: files uploaded in parts, as OpenAI's Uploads API has them
(``POST /v1/uploads``, ``/parts``, ``/complete``, ``/cancel``; docs/api.md, "Uploads").

* **create** announces the file's ``bytes`` (at most ``DPRC_MAX_UPLOAD_TOTAL_BYTES``), which are
  reserved against the tenant's storage quota (:func:`service.data.files.storage_used` counts a
  pending upload until it expires) — a create beyond the quota is 413
  ``storage_quota_exceeded``, as a file upload is — and the budget asked for (the extra fields
  ``epsilon_budget``, ``delta``, ``unbudgeted``; none: the tenant's default at completion);
* **parts** (at most ``DPRC_MAX_UPLOAD_PART_BYTES`` each, in any order, in parallel too) are
  streamed to disk, 1 MiB at a time, as ``files/<tenant>/uploads/<upload id>/<part id>.part``;
  together they may not hold more than the announced bytes;
* **complete** names the parts in their order: every id must be one of the upload's parts,
  listed once, and the listed parts must hold exactly the announced bytes (a part not listed —
  then necessarily an empty one — is dropped). The parts are concatenated in that order into
  one file (its MD5 checked against ``md5`` when given), which is validated and hashed line by
  line with bounded memory and stored as an ordinary file, exactly as a one-shot upload is
  (:func:`service.data.files.store_data_set`: budget group, audit entry ``file.upload``). A refusal
  (a bad line, an MD5 mismatch, a budget conflict) leaves the upload pending with its parts: it
  may be completed again (in another order) or cancelled. The same completion repeated (same
  parts, same order: an HTTP client's retry after a timeout) waits for the one under way and
  answers its file; another one meanwhile is 409 ``upload_completing``;
* **cancel** deletes the parts; an upload not completed ``DPRC_UPLOAD_EXPIRY_SECONDS`` after its
  creation **expires**: it no longer counts towards the quota, and its parts are deleted by
  :func:`sweep_expired` (run by the API every minute, at each new upload, and by any act on
  the upload itself).

Disk: while an upload completes, its parts, the assembled file and its hashes are on disk (over
twice its bytes; once, after the completion), in the tenant's folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, NotFound, TooLarge
from service.base.ids import new_id
from service.base.settings import Settings
from service.data import files, hash_recordings
from service.data.budget_groups import BudgetWish
from service.data.file_storage import clean_filename
from service.data.files import DataSet
from service.governance.keys import Caller
from service.governance.roles import Action, authorize
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import File, Upload, UploadPart

log = logging.getLogger(__name__)

PENDING, COMPLETED, CANCELLED, EXPIRED = "pending", "completed", "cancelled", "expired"
UPLOADS_DIR = "uploads"
COPY_CHUNK = 1 << 20  # parts are copied and assembled 1 MiB at a time
# a completion started this long ago and still marked is taken for dead (its process
# stopped): once past its expiry, the sweep expires the upload
COMPLETING_GRACE_SECONDS = 6 * 3600
SWEEP_LIMIT = 100
RETRY_POLL_SECONDS = 1.0
MIME_TYPE = re.compile(r"[A-Za-z0-9][\w!#$&^.+-]{0,126}/[A-Za-z0-9][\w!#$&^.+-]{0,126}", re.ASCII)
MD5 = re.compile(r"[0-9a-fA-F]{32}")


Part = UploadPart  # a part as an answer shows it (its row)


@dataclass(frozen=True)
class UploadState:
    """An upload as an answer shows it: its row and, once completed, its file."""

    row: Upload
    file: DataSet | None = None


def upload_dir(settings: Settings, tenant_id: int, upload_id: str) -> Path:
    """The folder of an upload's parts (and, while it completes, of the assembled file)."""
    return settings.files_dir / str(tenant_id) / UPLOADS_DIR / upload_id


def _part_path(directory: Path, part_id: str) -> Path:
    return directory / f"{part_id}.part"


def _free(settings: Settings, row: Upload) -> None:
    shutil.rmtree(upload_dir(settings, row.tenant_id, row.id), ignore_errors=True)


def _not_found(upload_id: str) -> NotFound:
    return NotFound(
        f"no such upload: {upload_id[:64]!r}", param="upload_id", code="upload_not_found"
    )


def _get(session: Session, caller: Caller, upload_id: str, *, lock: bool = False) -> Upload:
    query = select(Upload).where(Upload.id == upload_id, Upload.tenant_id == caller.tenant_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise _not_found(upload_id)
    return row


def _due_clause(t: int) -> ColumnElement[bool]:
    """Pending uploads past their expiry (and not being completed, unless that completion is
    taken for dead)."""
    return and_(
        Upload.status == PENDING,
        Upload.expires_at <= t,
        or_(
            Upload.completing_at.is_(None),
            Upload.completing_at <= t - COMPLETING_GRACE_SECONDS,
        ),
    )


def _is_due(row: Upload, t: int) -> bool:
    return (
        row.status == PENDING
        and row.expires_at <= t
        and (row.completing_at is None or row.completing_at <= t - COMPLETING_GRACE_SECONDS)
    )


def _expire_if_due(store: Store, session: Session, row: Upload) -> None:
    """Expire ``row`` (committed, parts deleted) when it is due."""
    if _is_due(row, now()):
        row.status, row.completing_at = EXPIRED, None
        session.commit()
        _free(store.settings, row)


def _require_pending(store: Store, session: Session, row: Upload) -> None:
    """Refuse an act on an upload that is no longer pending (expiring it first when due), or
    that is being completed."""
    _expire_if_due(store, session, row)
    if row.status != PENDING:
        what = {
            COMPLETED: f"completed (its file is {row.file_id})",
            CANCELLED: "cancelled",
            EXPIRED: "expired (an upload must be completed within "
            f"{store.settings.upload_expiry_seconds} seconds of its creation)",
        }.get(row.status, row.status)
        raise InvalidInput(
            f"upload {row.id} is {what}; no part may be added and it cannot be completed",
            param="upload_id",
            code=f"upload_{row.status}",
        )
    if row.completing_at is not None:
        raise Conflict(
            f"upload {row.id} is being completed", param="upload_id", code="upload_completing"
        )


def _parts_bytes(session: Session, upload_id: str) -> int:
    total = session.scalar(
        select(func.coalesce(func.sum(UploadPart.bytes), 0)).where(
            UploadPart.upload_id == upload_id
        )
    )
    return int(total or 0)


# -- create -----------------------------------------------------------------------------------


def create(
    store: Store,
    caller: Caller,
    *,
    size: int,
    filename: str,
    purpose: str,
    mime_type: str,
    wish: BudgetWish,
    user_field: str | None = None,
) -> UploadState:
    """A pending upload of ``size`` bytes, reserved against the tenant's storage quota;
    ``user_field``: the field naming each line's user (checked at completion)."""
    authorize(caller, Action.UPLOAD)
    files.check_purpose(purpose)
    files.check_user_field(user_field)
    settings = store.settings
    if size < 1:
        raise InvalidInput(f"bytes must be at least 1, got {size}", param="bytes")
    if size > settings.max_upload_total_bytes:
        raise TooLarge(
            f"an upload may hold at most {settings.max_upload_total_bytes} bytes "
            f"(DPRC_MAX_UPLOAD_TOTAL_BYTES), this one announces {size}",
            param="bytes",
            code="file_too_large",
        )
    if not MIME_TYPE.fullmatch(mime_type):
        raise InvalidInput(
            f"mime_type must be a MIME type such as text/jsonl, got {mime_type[:40]!r}",
            param="mime_type",
        )
    sweep_expired(store)
    t = now()
    with locked_session(store.sessions) as session:
        files.check_quota(session, caller, size, settings.tenant_storage_bytes, param="bytes")
        row = Upload(
            id=new_id("upload"),
            tenant_id=caller.tenant_id,
            filename=clean_filename(filename),
            purpose=purpose,
            mime_type=mime_type,
            bytes=size,
            created_at=t,
            expires_at=t + settings.upload_expiry_seconds,
            status=PENDING,
            epsilon_budget=wish.epsilon_budget,
            delta=wish.delta,
            unbudgeted=wish.unbudgeted,
            user_field=user_field,
            created_by=caller.key_id,
        )
        session.add(row)
        session.commit()
        return UploadState(row)


# -- parts ------------------------------------------------------------------------------------


def _copy_part(source: IO[bytes], target: Path, cap: int, room: int, upload_id: str) -> int:
    """Copy ``source`` to a new file ``target``, 1 MiB at a time; its size. Refused when it
    holds more than ``cap`` bytes (a part's limit) or than ``room`` (what the upload lacks)."""
    size = 0
    with open(target, "xb") as out:
        while chunk := source.read(COPY_CHUNK):
            size += len(chunk)
            if size > cap:
                raise TooLarge(
                    f"a part may hold at most {cap} bytes (DPRC_MAX_UPLOAD_PART_BYTES)",
                    param="data",
                    code="file_too_large",
                )
            if size > room:
                raise _beyond(upload_id, room)
            out.write(chunk)
    return size


def _beyond(upload_id: str, room: int) -> InvalidInput:
    return InvalidInput(
        f"this part would take upload {upload_id} beyond the bytes it announced: "
        f"{room} bytes remain",
        param="data",
        code="upload_bytes_exceeded",
    )


def add_part(store: Store, caller: Caller, upload_id: str, data: IO[bytes]) -> Part:
    """Add a part (``data``, read 1 MiB at a time) to a pending upload."""
    authorize(caller, Action.UPLOAD)
    settings = store.settings
    with locked_session(store.sessions) as session:
        row = _get(session, caller, upload_id)
        _require_pending(store, session, row)
        room = row.bytes - _parts_bytes(session, row.id)
    directory = upload_dir(settings, caller.tenant_id, row.id)
    directory.mkdir(parents=True, exist_ok=True)
    part_id = new_id("part")
    path = _part_path(directory, part_id)
    try:
        size = _copy_part(data, path, settings.max_upload_part_bytes, room, row.id)
        with locked_session(store.sessions) as session:
            row = _get(session, caller, upload_id, lock=True)
            _require_pending(store, session, row)
            room = row.bytes - _parts_bytes(session, row.id)
            if size > room:  # parts added meanwhile
                raise _beyond(row.id, room)
            part = UploadPart(id=part_id, upload_id=row.id, created_at=now(), bytes=size)
            session.add(part)
            session.commit()
            return part
    except BaseException as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, InvalidInput) and exc.code in (
            f"upload_{s}" for s in (COMPLETED, CANCELLED, EXPIRED)
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()  # emptied by the cancel or expiry meanwhile
        raise


# -- complete ---------------------------------------------------------------------------------


def _check_parts(row: Upload, parts: dict[str, UploadPart], part_ids: list[str]) -> None:
    listed: set[str] = set()
    for part_id in part_ids:
        if part_id in listed:
            raise InvalidInput(
                f"part {part_id[:64]!r} is listed twice", param="part_ids", code="duplicate_part"
            )
        if part_id not in parts:
            raise InvalidInput(
                f"part {part_id[:64]!r} is not a part of upload {row.id}",
                param="part_ids",
                code="upload_part_not_found",
            )
        listed.add(part_id)
    total = sum(parts[p].bytes for p in part_ids)
    if total != row.bytes:
        unlisted = [p for p in parts if p not in listed]
        more = f"; parts not listed: {', '.join(unlisted[:5])}" if unlisted else ""
        raise InvalidInput(
            f"the listed parts hold {total} bytes, upload {row.id} announced {row.bytes}{more}",
            param="part_ids",
            code="upload_bytes_mismatch",
        )


def _assemble(directory: Path, part_ids: list[str], target: Path) -> str:
    """Concatenate the parts in the given order into ``target``, 1 MiB at a time; the MD5
    (hex) of the whole."""
    digest = hashlib.md5(usedforsecurity=False)
    directory.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        for part_id in part_ids:
            try:
                part = open(_part_path(directory, part_id), "rb")
            except FileNotFoundError:
                raise InvalidInput(
                    f"the bytes of part {part_id} are gone from the server's data folder (a "
                    "restored database?); cancel this upload and upload the file again",
                    param="part_ids",
                    code="upload_part_gone",
                ) from None
            with part:
                while chunk := part.read(COPY_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def _release(store: Store, upload_id: str, started: int) -> None:
    """A failed completion: the upload is pending again (when nothing else changed it)."""
    try:
        with locked_session(store.sessions) as session:
            row = session.scalar(select(Upload).where(Upload.id == upload_id).with_for_update())
            if row is not None and row.status == PENDING and row.completing_at == started:
                row.completing_at = None
                session.commit()
    except Exception:  # noqa: BLE001 - the completion's own error is the answer
        log.exception("could not release upload %s after a failed completion", upload_id)


def complete(
    store: Store, caller: Caller, upload_id: str, part_ids: list[str], md5: str | None
) -> UploadState:
    """Complete an upload: its parts, in the order of ``part_ids``, become an ordinary file
    (validated line by line with bounded memory; see the module's docstring)."""
    authorize(caller, Action.UPLOAD)
    if md5 is not None and not MD5.fullmatch(md5):
        raise InvalidInput(f"md5 must be 32 hexadecimal digits, got {md5[:40]!r}", param="md5")
    settings = store.settings
    with locked_session(store.sessions) as session:
        row = _get(session, caller, upload_id, lock=True)
        _expire_if_due(store, session, row)
        if row.part_ids == part_ids and (
            row.status == COMPLETED or (row.status == PENDING and row.completing_at is not None)
        ):  # a retry (the client's, after a timeout): the same answer
            retry = True
        else:
            retry = False
            _require_pending(store, session, row)
            parts = {
                p.id: p
                for p in session.scalars(select(UploadPart).where(UploadPart.upload_id == row.id))
            }
            _check_parts(row, parts, part_ids)
            started = now()
            row.completing_at, row.part_ids = started, list(part_ids)
            session.commit()
    if retry:
        return _completion_of(store, caller, upload_id, part_ids, md5)
    directory = upload_dir(settings, caller.tenant_id, row.id)
    assembled = directory / "assembled"
    wish = BudgetWish(row.epsilon_budget, row.delta, row.unbudgeted)

    def within(session: Session, file_row: File) -> None:
        up = session.scalar(select(Upload).where(Upload.id == row.id).with_for_update())
        if up is None or up.status != PENDING or up.completing_at != started:
            raise Conflict(
                f"upload {row.id} changed while it was completed",
                param="upload_id",
                code="upload_completing",
            )
        up.status, up.completing_at, up.file_id = COMPLETED, None, file_row.id

    try:
        digest = _assemble(directory, part_ids, assembled)
        if md5 is not None and digest != md5.lower():
            raise InvalidInput(
                f"md5 mismatch: the parts in the given order have MD5 {digest}, not "
                f"{md5.lower()}; the upload stays pending",
                param="md5",
                code="md5_mismatch",
            )
        created = files.store_data_set(
            store,
            caller,
            assembled,
            row.filename,
            row.purpose,
            wish,
            max_line_bytes=settings.upload_max_line_bytes,
            spill_dir=directory,
            reserved=True,
            within=within,
            audit_detail={"upload_id": row.id, "parts": len(part_ids)},
            user_field=row.user_field,
            upload_id=row.id,
        )
    except BaseException:
        assembled.unlink(missing_ok=True)
        _release(store, row.id, started)
        raise
    _free(settings, row)
    if row.bytes >= TRIM_BYTES:
        give_back_memory()
    with store.sessions() as session:
        return UploadState(_get(session, caller, upload_id), created)


# a completion of this many bytes or more gives the heap's free memory back to the system
# (glibc keeps what its arenas freed: a big completion's short-lived objects — the digests'
# chunks and rows — would otherwise stay in the API's RSS)
TRIM_BYTES = 64 << 20


def give_back_memory() -> None:
    """``malloc_trim(0)``: glibc returns the free memory at the top of each of its arenas and
    the free pages inside them; nothing where the C library has no such call."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


def _completion_of(
    store: Store, caller: Caller, upload_id: str, part_ids: list[str], md5: str | None
) -> UploadState:
    """The answer to a completion that repeats the one under way or done (same parts, same
    order): its result once it ends — an HTTP client that timed out and retried gets it. One
    that failed (the upload pending again) is run again, to answer its error."""
    deadline = now() + COMPLETING_GRACE_SECONDS
    while True:
        with store.sessions() as session:
            row = _get(session, caller, upload_id)
        if row.status == COMPLETED and row.file_id is not None:
            return UploadState(row, files.retrieve(store, caller, row.file_id))
        if row.status != PENDING or row.completing_at is None or now() > deadline:
            return complete(store, caller, upload_id, part_ids, md5)
        time.sleep(RETRY_POLL_SECONDS)


# -- cancel and expiry ------------------------------------------------------------------------


def cancel(store: Store, caller: Caller, upload_id: str) -> UploadState:
    """Cancel a pending upload: its parts are deleted and its bytes no longer reserved. An
    upload already cancelled or expired is answered as it is; a completed one is 400."""
    authorize(caller, Action.UPLOAD)
    with locked_session(store.sessions) as session:
        row = _get(session, caller, upload_id, lock=True)
        _expire_if_due(store, session, row)
        if row.status in (CANCELLED, EXPIRED):
            return UploadState(row)
        if row.status == COMPLETED:
            raise InvalidInput(
                f"upload {row.id} is completed (its file is {row.file_id}): delete the file "
                "instead",
                param="upload_id",
                code="upload_completed",
            )
        if row.completing_at is not None:
            raise Conflict(
                f"upload {row.id} is being completed", param="upload_id", code="upload_completing"
            )
        row.status = CANCELLED
        session.commit()
    _free(store.settings, row)
    return UploadState(row)


def sweep_expired(store: Store, limit: int = SWEEP_LIMIT) -> int:
    """Expire the pending uploads (of every tenant) past their expiry, at most ``limit``, and
    delete their parts; how many. Cheap when none is due (one indexed read, no lock). Roll back
    the hash recordings taken for dead first (:func:`service.data.hash_recordings.sweep_stale`:
    their uploads are pending again)."""
    hash_recordings.sweep_stale(store)
    t = now()
    with store.sessions() as session:
        if session.scalar(select(Upload.id).where(_due_clause(t)).limit(1)) is None:
            return 0
    with locked_session(store.sessions) as session:
        rows = list(
            session.scalars(
                select(Upload)
                .where(_due_clause(t))
                .order_by(Upload.seq)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        for row in rows:
            row.status, row.completing_at = EXPIRED, None
        session.commit()
    for row in rows:
        _free(store.settings, row)
    if rows:
        log.info("expired %d upload(s)", len(rows))
    return len(rows)
