"""The files use cases: JSONL validation at upload, storage under ``DPRC_DATA_DIR/files``,
reads, deletion, and a data set's budget (its rules are :mod:`service.budget`'s). Reads return
:class:`DataSet` (the row and the budget it shows)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dprc_core.training.data import DataError, summarize_jsonl
from service import budget
from service.clock import now
from service.db import locked_session
from service.errors import Conflict, InvalidInput, NotFound, TooLarge
from service.file_storage import clean_filename, storage_dir, write_atomic
from service.ids import new_id
from service.job_runs import validation_file_id
from service.job_status import ACTIVE
from service.keys import Caller
from service.pagination import cursor_page
from service.private_data import remove_run_folders
from service.store import Store
from service.tables import File, Job, Tenant

UPLOAD_PURPOSES = ("fine-tune",)


# -- JSONL ------------------------------------------------------------------------------------


def validate_jsonl(data: bytes) -> tuple[int, str]:
    """(number of examples, format) of a fine-tune JSONL file, or :class:`InvalidInput`
    (400, ``param: file``) naming the first bad line and why. The file is read line by line
    by the code the worker loads it with (``dprc_core.training.data.summarize_jsonl``: lines
    end at ``\n`` only, so U+2028 is a character of its line; nesting, huge integers, unpaired
    surrogates, whitespace-only text, mixed formats refused; a classification file needs two
    classes); nothing is tokenized here."""
    try:
        summary = summarize_jsonl(io.BytesIO(data))
    except DataError as exc:
        raise InvalidInput(str(exc), param="file", code="invalid_jsonl") from exc
    return summary.n_examples, summary.format


def read_capped(stream: IO[bytes], cap: int) -> bytes:
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise TooLarge(
            f"file exceeds the upload limit of {cap} bytes", param="file", code="file_too_large"
        )
    return data


# -- objects ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSet:
    """A file as a read shows it: its row and the budget it shows (None: it has none)."""

    row: File
    budget: budget.FileBudget | None


def _shown(f: File, live_spent: float | None = None) -> DataSet:
    """``live_spent`` (:func:`service.budget.live_spent`) replaces the stored ``spent``."""
    return DataSet(f, budget.file_budget(f, live_spent))


# -- operations -------------------------------------------------------------------------------


def create_file(
    store: Store,
    caller: Caller,
    data: bytes,
    filename: str | None,
    purpose: str,
    epsilon_budget: float | None,
    delta: float | None,
) -> DataSet:
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidInput(
            f"purpose must be one of {UPLOAD_PURPOSES}, got {purpose[:40]!r}",
            param="purpose",
            code="invalid_value",
        )
    n, fmt = validate_jsonl(data)
    eps_b, d = budget.budget_values(n, epsilon_budget, delta)
    file_id = new_id("file")
    path = write_atomic(storage_dir(store, caller.tenant_id), f"{file_id}.jsonl", data)
    try:
        with locked_session(store.sessions) as session:
            _check_quota(session, caller, len(data), store.settings.tenant_storage_bytes)
            row = File(
                id=file_id,
                tenant_id=caller.tenant_id,
                filename=clean_filename(filename),
                purpose=purpose,
                bytes=len(data),
                created_at=now(),
                storage_path=str(path),
                n_examples=n,
                data_format=fmt,
                epsilon_budget=eps_b,
                delta=d,
                epsilon_spent=0.0,
                epsilon_committed=0.0,
                deleted=False,
            )
            session.add(row)
            session.commit()
            return _shown(row)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def storage_used(session: Session, tenant_id: int) -> int:
    """Bytes held by the tenant's files that are not deleted (uploads and archives)."""
    used = session.scalar(
        select(func.coalesce(func.sum(File.bytes), 0)).where(
            File.tenant_id == tenant_id, File.deleted.is_(False)
        )
    )
    return int(used or 0)


def _check_quota(session: Session, caller: Caller, size: int, quota: int) -> None:
    """Refuse an upload of ``size`` bytes that would take the tenant beyond ``quota``; under
    the tenant's lock (its row FOR UPDATE on PostgreSQL; the write lock on SQLite), so
    concurrent uploads are counted one after the other."""
    session.get(Tenant, caller.tenant_id, with_for_update=True)
    used = storage_used(session, caller.tenant_id)
    if used + size > quota:
        raise TooLarge(
            f"storage quota exceeded: this tenant's files hold {used} bytes, this upload of "
            f"{size} bytes would bring them beyond the quota of {quota} bytes; delete files "
            "(GET /v1/files, DELETE /v1/files/{id}) to make room",
            param="file",
            code="storage_quota_exceeded",
        )


def get_row(session: Session, caller: Caller, file_id: str) -> File:
    row = session.scalar(
        select(File).where(
            File.id == file_id, File.tenant_id == caller.tenant_id, File.deleted.is_(False)
        )
    )
    if row is None:
        raise NotFound(f"no such file: {file_id[:64]!r}", param="file_id", code="file_not_found")
    return row


def _read_object(session: Session, f: File) -> DataSet:
    """A read's data set: ``spent`` composed from the steps its jobs ran so far."""
    if f.epsilon_budget is None or f.delta is None:
        return _shown(f)
    return _shown(f, budget.live_spent(session, f))


def retrieve(store: Store, caller: Caller, file_id: str) -> DataSet:
    with store.sessions() as session:
        return _read_object(session, get_row(session, caller, file_id))


def list_files(
    store: Store, caller: Caller, purpose: str | None, limit: int, after: str | None, order: str
) -> tuple[list[DataSet], bool]:
    with store.sessions() as session:
        q = select(File).where(File.tenant_id == caller.tenant_id, File.deleted.is_(False))
        if purpose:
            q = q.where(File.purpose == purpose)
        rows, more = cursor_page(session, q, File, after, limit, "file", descending=order == "desc")
        return [_read_object(session, r) for r in rows], more


def content_path(store: Store, caller: Caller, file_id: str) -> tuple[Path, str]:
    with store.sessions() as session:
        row = get_row(session, caller, file_id)
        return Path(row.storage_path), row.filename


def delete(store: Store, caller: Caller, file_id: str) -> str:
    with locked_session(store.sessions) as session:
        row = budget.lock_file(session, file_id, caller.tenant_id)
        if row is None:
            raise NotFound(
                f"no such file: {file_id[:64]!r}", param="file_id", code="file_not_found"
            )
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
        path = Path(row.storage_path)
        jobs = list(session.scalars(select(Job.id).where(Job.training_file_id == row.id)))
        session.commit()
    path.unlink(missing_ok=True)
    remove_run_folders(store.settings.data_dir, jobs)  # what was derived from it
    return file_id


def set_budget(
    store: Store, caller: Caller, file_id: str, epsilon_budget: float, delta: float | None
) -> DataSet:
    """Set or change a data set's budget; refused (:class:`Conflict`) if what is already
    committed does not fit the new one (:func:`service.budget.change_budget`)."""
    with locked_session(store.sessions) as session:
        row = budget.lock_file(session, file_id, caller.tenant_id)
        if row is None:
            raise NotFound(
                f"no such file: {file_id[:64]!r}", param="file_id", code="file_not_found"
            )
        if row.purpose not in UPLOAD_PURPOSES or row.n_examples is None:
            raise InvalidInput(
                "only fine-tune data sets carry a budget", param="file_id", code="invalid_value"
            )
        budget.change_budget(session, row, epsilon_budget, delta)
        session.commit()
        return _shown(row)


def budget_history(store: Store, caller: Caller, file_id: str) -> budget.History:
    """The file's composed ε after each of its jobs, in creation order
    (:func:`service.budget.history`)."""
    with store.sessions() as session:
        row = get_row(session, caller, file_id)
        if row.n_examples is None:
            raise InvalidInput(
                "only fine-tune data sets have a budget history",
                param="file_id",
                code="invalid_value",
            )
        return budget.history(session, row)
