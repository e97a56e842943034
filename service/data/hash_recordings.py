"""A big upload's example hashes recorded in short transactions, so that the other tenants'
writes never wait for them (issue 45: a 10⁷-example upload held SQLite's write lock for 161 s).

An upload of the Uploads API with at least ``BATCHED_MIN`` distinct examples (and no users:
per-user data is recorded in one transaction, as before) is stored in four steps
(:func:`service.data.files.store_data_set`):

1. **the lease** — under the tenant's lock, a ``hash_recordings`` row for the tenant (at most
   one: the table's key), with the largest ``example_hashes.id`` (``base_id``) and a token;
   while it exists no other upload of the tenant is placed in a budget group
   (:func:`check_free` in :func:`service.data.budget_groups.place`; :func:`wait_until_free`
   before it): the tenant's uploads take turns, as they always did;
2. **the placement** — the groups the upload shares examples with, looked up outside any write
   transaction (nothing of the tenant's changes meanwhile: the lease), then under the tenant's
   lock the same rules as a small upload's (:func:`~service.data.budget_groups.place`): a new
   group (committed, empty, no file) or the existing one it joins; the lease names it;
3. **the hashes** — ``BATCH_ROWS`` at a time, each batch its own write transaction (tens of
   milliseconds), which first checks that the lease is still this recording's and beats it,
   then, on SQLite, a pause a quarter as long (``PAUSE_SHARE``), in which other writers take
   its one write lock (on PostgreSQL other tenants' writes take other rows' locks: no pause,
   and ``WRITERS`` connections write at once, :func:`write_batches`);
4. **the file** — under the tenant's lock: the file's row (in its group), the group's
   ``n_examples``, the audit entries and the lease's deletion, in one transaction.

So a file is stored whole or not at all: its row exists only once all its hashes do. A
recording that fails (an error, a refusal) is rolled back at once; one whose process died
(``kill -9``, a crash) leaves its lease, which stops beating: once ``STALE_SECONDS`` old it is
taken over and rolled back (:func:`recover`) by the next upload of the tenant, or by the API's
minute sweep (:func:`sweep_stale`) — the hashes above ``base_id`` in its group deleted in
batches, a group it made removed (it holds no file), the content moved into place deleted, and
the upload pending again, so that a retry of its completion runs it afresh. Nothing is charged
meanwhile: no job can name a file that has no row.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.errors import Conflict
from service.base.ids import new_id
from service.store.db import is_sqlite, locked_session
from service.store.store import Store
from service.store.tables import (
    BudgetGroup,
    ExampleHash,
    File,
    HashRecording,
    Tenant,
    Upload,
)

log = logging.getLogger(__name__)

BATCHED_MIN = 200_000  # distinct examples from which an upload's hashes are recorded in batches
BATCH_ROWS = 10_000  # hashes a recording transaction inserts (tens of milliseconds)
# after each batch on SQLite the recording pauses for this share of the time it held the write
# lock, so that other writers get it: SQLite's busy handler sleeps between its tries (up to
# 100 ms), and a recording that took the lock again at once would keep winning it
PAUSE_SHARE = 0.25
PAUSE_MAX_SECONDS = 0.05
STALE_SECONDS = 600  # a lease not beaten for this long is taken for dead (lookups do not beat)
BEAT_SECONDS = 5.0  # PostgreSQL's parallel writers beat the lease at most this often
# PostgreSQL: connections writing a recording's batches at once (its per-row work is the
# server's: two backends use both cores; docs/benchmarks/big_n.md)
WRITERS = 2
WAIT_SECONDS = 30 * 60  # how long an upload waits for another of its tenant's to be recorded
POLL_SECONDS = 0.2
BUSY = "upload_recording"


class RecordingBusy(Conflict):
    """Another upload of the tenant is being recorded (409 ``upload_recording``)."""

    code = BUSY


def _busy(tenant_id: int) -> RecordingBusy:
    return RecordingBusy(
        "another upload of this tenant is being recorded (its example hashes): uploads of a "
        "tenant are placed one after the other; retry in a moment",
        param="file",
    )


def check_free(session: Session, tenant_id: int, token: str | None = None) -> None:
    """Refuse (:class:`RecordingBusy`) to place an upload while another recording holds the
    tenant's lease (``token``: the caller's own, which may)."""
    row = session.get(HashRecording, tenant_id)
    if row is not None and row.token != token:
        raise _busy(tenant_id)


def _stale(row: HashRecording, t: int) -> bool:
    return row.beat_at <= t - STALE_SECONDS


def wait_until_free(store: Store, tenant_id: int, timeout: float | None = None) -> None:
    """Return once the tenant holds no recording's lease (one taken for dead is rolled back
    first); :class:`RecordingBusy` after ``timeout`` seconds (default ``WAIT_SECONDS``)."""
    deadline = time.monotonic() + (WAIT_SECONDS if timeout is None else timeout)
    while True:
        with store.sessions() as session:
            row = session.get(HashRecording, tenant_id)
            if row is not None:
                session.expunge(row)
        if row is None:
            return
        if _stale(row, now()):
            recover(store, row)
            continue
        if time.monotonic() > deadline:
            raise _busy(tenant_id)
        time.sleep(POLL_SECONDS)


def acquire(session: Session, tenant_id: int, file_id: str, upload_id: str | None) -> HashRecording:
    """The tenant's lease for a new recording, added to ``session`` (under the tenant's lock;
    the caller commits); :class:`RecordingBusy` if another holds it."""
    check_free(session, tenant_id)
    base = session.scalar(select(func.max(ExampleHash.id)))
    t = now()
    row = HashRecording(
        tenant_id=tenant_id,
        token=new_id("rec"),
        file_id=file_id,
        upload_id=upload_id,
        group_id=None,
        new_group=False,
        base_id=int(base or 0),
        started_at=t,
        beat_at=t,
    )
    session.add(row)
    return row


def own(session: Session, tenant_id: int, token: str, shared: bool = False) -> HashRecording:
    """The lease, locked and beaten, when it is still ``token``'s; else :class:`Conflict`
    (it was taken for dead and rolled back: this recording must stop). ``shared``: locked
    ``FOR SHARE`` and not beaten, so that the recording's writers hold it at once (a takeover's
    ``FOR UPDATE`` waits for their batches: :func:`write_batches`)."""
    row = session.scalar(
        select(HashRecording)
        .where(HashRecording.tenant_id == tenant_id)
        .with_for_update(read=shared)
    )
    if row is None or row.token != token:
        raise Conflict(
            "this upload's recording was taken for dead and rolled back (it stalled for "
            f"{STALE_SECONDS} seconds); complete the upload again",
            param="file",
            code="upload_recording_lost",
        )
    if not shared:
        row.beat_at = now()
    return row


# Inserts a batch: (session, start, stop) -> rows inserted
BatchInsert = Callable[[Session, int, int], int]


def write_batches(
    store: Store, tenant_id: int, token: str, n: int, insert: BatchInsert, writers: int = 1
) -> int:
    """Step 3: ``insert`` the rows [0, n) in batches of ``BATCH_ROWS``, each its own write
    transaction that first checks the lease is still ``token``'s; how many rows it inserted.

    SQLite: one writer, each batch followed by a pause (``PAUSE_SHARE``) in which other writers
    take its one write lock. PostgreSQL: ``writers`` connections at once, each on its own
    contiguous range (sorted digests: each writer appends to its own part of the unique
    index); their batches lock the lease ``FOR SHARE`` and a beat (``FOR UPDATE``) every
    ``BEAT_SECONDS`` waits for the batches in flight. When a writer fails, the others stop
    before their next batch and every writer has ended before the error is raised: the
    caller's rollback then finds every row this recording will ever insert."""
    if is_sqlite(store.engine) or writers <= 1:
        return _write_range(store, tenant_id, token, 0, n, insert, _Writers(1, False))
    shared = _Writers(writers, True)
    bounds = [n * i // writers for i in range(writers + 1)]
    with ThreadPoolExecutor(writers, thread_name_prefix="dprc-record") as pool:
        futures = [
            pool.submit(_write_range, store, tenant_id, token, lo, hi, insert, shared)
            for lo, hi in itertools.pairwise(bounds)
        ]
        wait(futures, return_when=FIRST_EXCEPTION)
        shared.stop.set()  # a no-op when all ended well
        wait(futures)
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        raise errors[0]
    return sum(f.result() for f in futures)


class _Writers:
    """What a recording's writers share: whether they run at once (PostgreSQL), the signal to
    stop, and when the lease was last beaten."""

    def __init__(self, count: int, parallel: bool) -> None:
        self.parallel = parallel and count > 1
        self.stop = threading.Event()
        self._guard = threading.Lock()
        self._beaten = time.monotonic()

    def beat_due(self) -> bool:
        with self._guard:
            if time.monotonic() - self._beaten < BEAT_SECONDS:
                return False
            self._beaten = time.monotonic()
            return True


def _write_range(
    store: Store,
    tenant_id: int,
    token: str,
    lo: int,
    hi: int,
    insert: BatchInsert,
    writers: _Writers,
) -> int:
    pause = is_sqlite(store.engine)
    added = 0
    for start in range(lo, hi, BATCH_ROWS):
        if writers.stop.is_set():
            break
        stop = min(start + BATCH_ROWS, hi)
        began = time.monotonic()
        with locked_session(store.sessions) as session:
            if not pause:
                lazy_commit(session)
            own(session, tenant_id, token, shared=writers.parallel)
            added += insert(session, start, stop)
            session.commit()
        if pause:
            pause_after(time.monotonic() - began)
        if writers.parallel and writers.beat_due():
            with locked_session(store.sessions) as session:
                own(session, tenant_id, token)
                session.commit()
    return added


def rollback(store: Store, tenant_id: int, token: str, content: Path | None = None) -> None:
    """Undo a recording that holds the lease ``token``: delete the hashes it inserted
    (``BATCH_ROWS`` a transaction), a group it made (it holds no file), ``content`` (the data
    set's file moved into place, when no file row names it), release its upload and delete the
    lease. Nothing happens if the lease is no longer ``token``'s."""
    while True:
        with locked_session(store.sessions) as session:
            try:
                lease = own(session, tenant_id, token)
            except Conflict:
                return
            if lease.group_id is None:
                break
            ids = list(
                session.scalars(
                    select(ExampleHash.id)
                    .where(
                        ExampleHash.group_id == lease.group_id,
                        ExampleHash.tenant_id == tenant_id,
                        ExampleHash.id > lease.base_id,
                    )
                    .limit(BATCH_ROWS)
                )
            )
            if not ids:
                break
            session.execute(delete(ExampleHash).where(ExampleHash.id.in_(ids)))
            session.commit()
    with locked_session(store.sessions) as session:
        session.get(Tenant, tenant_id, with_for_update=True)
        try:
            lease = own(session, tenant_id, token)
        except Conflict:
            return
        stored = session.scalar(select(File.id).where(File.id == lease.file_id))
        if lease.new_group and lease.group_id is not None and stored is None:
            # no job can name it: jobs name files, and none is in it
            used = session.scalar(select(File.id).where(File.group_id == lease.group_id).limit(1))
            if used is None:
                session.execute(delete(BudgetGroup).where(BudgetGroup.id == lease.group_id))
        if lease.upload_id is not None and stored is None:
            up = session.scalar(
                select(Upload).where(Upload.id == lease.upload_id).with_for_update()
            )
            if up is not None and up.status == "pending":
                up.completing_at = None
        session.delete(lease)
        session.commit()
    if content is not None and stored is None:
        content.unlink(missing_ok=True)


def recover(store: Store, row: HashRecording) -> bool:
    """Take over a lease taken for dead (``row`` as read; nothing if it changed meanwhile) and
    roll its recording back; whether it did."""
    with locked_session(store.sessions) as session:
        lease = session.scalar(
            select(HashRecording).where(HashRecording.tenant_id == row.tenant_id).with_for_update()
        )
        if lease is None or lease.token != row.token or not _stale(lease, now()):
            return False
        token = new_id("rec")
        lease.token, lease.beat_at = token, now()
        content = store.settings.files_dir / str(lease.tenant_id) / f"{lease.file_id}.jsonl"
        session.commit()
    log.warning(
        "rolling back the hash recording of file %s (tenant %s): it stopped beating",
        row.file_id,
        row.tenant_id,
    )
    rollback(store, row.tenant_id, token, content)
    return True


def sweep_stale(store: Store) -> int:
    """Roll back the recordings taken for dead (the API runs it every minute); how many."""
    t = now()
    with store.sessions() as session:
        rows = list(
            session.scalars(select(HashRecording).where(HashRecording.beat_at <= t - STALE_SECONDS))
        )
        for row in rows:
            session.expunge(row)
    return sum(recover(store, row) for row in rows)


def lazy_commit(session: Session) -> None:
    """PostgreSQL: this transaction (a batch of hashes) commits without waiting for its WAL to
    reach the disk (``synchronous_commit = off``, this transaction only). Nothing of a crash's
    is lost that a recording needs: the WAL is written in order, so the file's row — committed
    at the end with the server's setting — is on disk only once every batch before it is; a
    crash of the server loses at most the last batches with the lease's beats, and the lease
    (committed with the server's setting) is taken for dead and rolled back as after a
    ``kill -9``."""
    session.execute(text("SET LOCAL synchronous_commit = off"))


def pause_after(held_s: float) -> None:
    """The pause after a batch that held the write lock ``held_s`` seconds."""
    time.sleep(min(PAUSE_MAX_SECONDS, held_s * PAUSE_SHARE))
