"""Keyed hashes of a data set's examples, so that one budget covers the same data however
often it is uploaded (:mod:`service.data.budget_groups`).

Each example's hash is HMAC-SHA256, keyed by a per-tenant secret (32 random bytes in
``DPRC_DATA_DIR/secrets/tenant-<id>.key``, written 0600 once), over the **canonical key** of
the text the model is trained on (:func:`canonical_text`): a text line's ``text``, a chat
line's messages as the worker joins them (``role: content`` lines, whatever template renders
them and whatever their weights), a prompt-completion line's prompt immediately followed by its
completion (so it shares its key with the text line of that text), a classification line's
``text``, each put in Unicode NFKC, case-folded, with format and zero-width characters removed
and whitespace runs collapsed and trimmed — so edits that a tokenizer cannot see (trailing or
doubled spaces, no-break spaces, case, compatibility forms) give the same key. The label is left
out on purpose: a relabelled copy holds the same people's text, so it shares the budget. The
secret keeps the stored hashes from being tested against guessed lines by anyone who reads the
database without the data folder.

What hashing cannot catch: a copy in which each line was edited in a way the model can see (a
changed word, a paraphrase): such a copy is new data to the hash; a data owner approves every
upload that is not theirs (:mod:`service.data.approvals`), with an overlap report.

Hashes stored before the canonical key (a tenant's ``hash_version`` 1) are re-keyed from the
files' content at start-up (:mod:`service.data.rekey`); where content is gone, the tenant keeps
``legacy_hashes`` and uploads are also looked up by their raw-text hash (``legacy=True``).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import hmac
import io
import logging
import operator
import os
import secrets
import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, overload

import numpy as np

from dprc_core.training.data import DEFAULT_USER_FIELD, DataError, read_fields
from service.base.errors import InvalidInput
from service.data.user_counts import UserCounter, UserCounts

log = logging.getLogger(__name__)

SECRETS_DIR = "secrets"
# characters no model input shows: Unicode's format characters (category Cf: zero-width space
# and joiners, soft hyphen, BOM, bidirectional marks) and the variation selectors (Mn, but
# invisible); removed from the canonical key


@functools.cache
def _invisible() -> dict[int, None]:
    """The translation table that drops them (built once, on first use: ~0.2 s)."""
    codes = [c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    codes += [*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)]
    return dict.fromkeys(codes)


def canonical_text(text: str) -> str:
    """The canonical key of an example's text: Unicode NFKC, invisible characters removed,
    case-folded (then NFKC again: folding can leave non-normal sequences), and every run of
    whitespace one space, trimmed. Two texts with the same key differ only in ways that no
    uncased tokenizer, and few cased ones, can see. ASCII text takes a shorter way to the same
    key: NFKC leaves it as it is, it holds no invisible character, and its case folding is
    ``lower()``."""
    if text.isascii():
        return " ".join(text.lower().split())
    text = unicodedata.normalize("NFKC", text).translate(_invisible())
    text = unicodedata.normalize("NFKC", text.casefold())
    return " ".join(text.split())


_cache: dict[Path, bytes] = {}
_guard = threading.Lock()


def tenant_secret(data_dir: Path, tenant_id: int) -> bytes:
    """The tenant's HMAC key, created (0600, exclusively: concurrent processes agree) on
    first use."""
    path = (data_dir / SECRETS_DIR / f"tenant-{tenant_id}.key").resolve()
    with _guard:
        if path in _cache:
            return _cache[path]
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            value = bytes.fromhex(path.read_text().strip())
        else:
            value = secrets.token_bytes(32)
            with os.fdopen(fd, "w") as out:
                out.write(value.hex())
                out.flush()
                os.fsync(out.fileno())
        if len(value) < 32:
            raise RuntimeError(f"{path} holds a key shorter than 32 bytes")
        _cache[path] = value
        return value


# The digests of a data set are kept compact: 32 raw bytes each (never a Python string each),
# sorted and made distinct in runs of RUN_RECORDS held in memory, spilled to files when there is
# more than one run and merged (heapq.merge, READ_RECORDS of each run at a time, at most
# MAX_FAN_IN runs at once: more are merged in groups first) into one file of distinct sorted
# records. Memory, whatever the data set's size: one run while hashing (a set of RUN_RECORDS
# bytes objects, ~7 MB), MAX_FAN_IN blocks of READ_RECORDS records while merging (2 MiB).
# Disk: 32 bytes an example, twice while the runs are merged (a 2 GB data set of 100-byte
# lines: ~0.7 GB, ~1.3 GB at the peak), in the folder the caller names.
DIGEST_BYTES = 32
RUN_RECORDS = 1 << 16
READ_RECORDS = 2048
MAX_FAN_IN = 32
MIN_EXAMPLES = 2  # summarize_jsonl's default: a data set needs two examples


class Digests(Sequence[str]):
    """Distinct keyed hashes in sorted order, read as hex strings: held as 32-byte records in
    memory (``source`` bytes) or in a file (``source`` a path), so that millions of them cost
    32 bytes each (in memory or on disk), not a string each. Slices read only their records."""

    def __init__(self, source: bytes | Path, count: int, width: int = DIGEST_BYTES):
        self._source = source
        self._count = count
        self.width = width  # bytes a record (a user-level upload's pairs: 64)

    def __len__(self) -> int:
        return self._count

    def _raw(self, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""
        if isinstance(self._source, bytes):
            return self._source[start * self.width : stop * self.width]
        with open(self._source, "rb") as fh:
            fh.seek(start * self.width)
            return fh.read((stop - start) * self.width)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            raw = self._raw(start, stop)
            w = self.width
            return [raw[i : i + w].hex() for i in range(0, len(raw), w)]
        i = operator.index(index)
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("digest index out of range")
        return self._raw(i, i + 1).hex()

    def __iter__(self) -> Iterator[str]:
        for start in range(0, self._count, READ_RECORDS):
            yield from self[start : start + READ_RECORDS]

    def save(self, path: Path) -> None:
        """Write the records to ``path`` (0600, fsynced), READ_RECORDS at a time."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            for start in range(0, self._count, READ_RECORDS):
                fh.write(self._raw(start, min(start + READ_RECORDS, self._count)))
            fh.flush()
            os.fsync(fh.fileno())

    @classmethod
    def load(cls, path: Path, width: int = DIGEST_BYTES) -> Digests:
        """The records :meth:`save` wrote (read from the file as they are used)."""
        return cls(path, path.stat().st_size // width, width)


def save_digests(digests: Sequence[str], path: Path) -> None:
    """Write sorted distinct digests to ``path`` as :meth:`Digests.save` does."""
    if isinstance(digests, Digests):
        digests.save(path)
        return
    raw = b"".join(bytes.fromhex(d) for d in digests)
    Digests(raw, len(digests), len(raw) // max(len(digests), 1) or DIGEST_BYTES).save(path)


@dataclass(frozen=True)
class HashedData:
    """A validated data set: its number of examples (lines), its format, the distinct
    keyed hashes of its examples (sorted hex, as :class:`Digests`) and, when its lines name
    their users (user-level DP), their count."""

    n_examples: int
    format: str
    digests: Sequence[str]
    users: UserCounts | None = None
    # the raw-text hashes (tenants with ``legacy_hashes``, looked up only, never stored)
    legacy_digests: Sequence[str] | None = None
    # lines that name users: the users' keyed digests, and (example digest + user digest) pairs
    # as 128 hex characters (service/data/user_groups.py)
    user_digests: Sequence[str] | None = None
    pairs: Sequence[str] | None = None


def _records(run: bytes | Path, width: int) -> Iterator[bytes]:
    """The ``width``-byte records of a sorted run, read READ_RECORDS at a time."""
    if isinstance(run, bytes):
        for i in range(0, len(run), width):
            yield run[i : i + width]
        return
    with open(run, "rb") as fh:
        while block := fh.read(READ_RECORDS * width):
            for i in range(0, len(block), width):
                yield block[i : i + width]


def _distinct(runs: list[bytes | Path], width: int) -> Iterator[bytes]:
    """The distinct records of sorted runs, in order (a k-way merge)."""
    last = b""
    for record in heapq.merge(*(_records(r, width) for r in runs)):
        if record != last:
            yield record
            last = record


def sorted_distinct(records: bytes | bytearray, width: int) -> bytes:
    """The distinct ``width``-byte records of ``records`` in byte order (what
    ``b"".join(sorted(set(...)))`` of them gives), sorted by numpy as opaque records: memcmp
    order, about 0.25 µs a record against Python's 1.1 µs."""
    if not records:
        return b""
    view = np.frombuffer(records, dtype=np.dtype((np.void, width)))
    return bytes(np.unique(view).tobytes())


def _run_bytes(runs: list[bytes | Path]) -> int:
    return sum(len(r) if isinstance(r, bytes) else r.stat().st_size for r in runs)


def _merge_in_memory(runs: list[bytes | Path], target: Path, width: int) -> int:
    """The distinct records of ``runs`` written to ``target`` in order, all read at once and
    sorted by numpy (:func:`sorted_distinct`; several times faster than a k-way merge in
    Python); the runs' files are deleted; how many records."""
    data = bytearray()
    for run in runs:
        data += run if isinstance(run, bytes) else run.read_bytes()
    out = sorted_distinct(data, width)
    del data
    target.write_bytes(out)
    for run in runs:
        if isinstance(run, Path):
            run.unlink(missing_ok=True)
    return len(out) // width


class _DigestSpool:
    """Collects raw digests; :meth:`finish` gives them distinct and sorted. With a
    ``spill_dir``, runs beyond the first are written to a folder made in it (removed by
    :meth:`close`); without one they stay in memory as 32-byte records."""

    def __init__(
        self,
        spill_dir: Path | None,
        width: int = DIGEST_BYTES,
        run_records: int | None = None,
        merge_bytes: int = 0,
    ):
        self._spill_dir = spill_dir
        self._merge_bytes = merge_bytes  # runs of at most this many bytes: merged in memory
        self._width = width
        self._run_records = run_records or RUN_RECORDS
        self._folder: Path | None = None
        self._pending = bytearray()  # the current run's records, as added
        self._limit = self._run_records * width
        self._runs: list[bytes | Path] = []

    def add(self, digest: bytes) -> None:
        self._pending += digest
        if len(self._pending) >= self._limit:
            self._flush()

    def _sorted(self) -> bytes:
        """The current run's distinct records in (byte) order; the run emptied."""
        run = sorted_distinct(self._pending, self._width)
        self._pending = bytearray()
        return run

    def _flush(self) -> None:
        run = self._sorted()
        if self._spill_dir is None:
            self._runs.append(run)
            return
        path = self._file(f"run-{len(self._runs)}")
        path.write_bytes(run)
        self._runs.append(path)

    def _file(self, name: str) -> Path:
        if self._folder is None:
            assert self._spill_dir is not None
            self._folder = Path(tempfile.mkdtemp(dir=self._spill_dir, prefix=".digests-"))
        return self._folder / name

    def finish(self) -> Digests:
        w = self._width
        if not self._runs:  # one run: in memory
            run = self._sorted()
            return Digests(run, len(run) // w, w)
        if self._pending:
            self._flush()
        if self._spill_dir is None:
            out = b"".join(_distinct(self._runs, w))
            self._runs = []
            return Digests(out, len(out) // w, w)
        runs = self._runs
        if _run_bytes(runs) <= self._merge_bytes:
            path = self._file("digests")
            _merge_in_memory(runs, path, w)
            self._runs = []
            return Digests(path, path.stat().st_size // w, w)
        passes = 0
        while len(runs) > MAX_FAN_IN:  # merge groups first: memory is MAX_FAN_IN blocks
            passes += 1
            groups = [runs[i : i + MAX_FAN_IN] for i in range(0, len(runs), MAX_FAN_IN)]
            runs = [
                group[0] if len(group) == 1 else self._merged(group, f"merge-{passes}-{i}")
                for i, group in enumerate(groups)
            ]
        path = self._merged(runs, "digests")
        self._runs = []
        return Digests(path, path.stat().st_size // w, w)

    def _merged(self, runs: list[bytes | Path], name: str) -> Path:
        """Merge sorted runs into one file of distinct sorted records; the runs are deleted."""
        path = self._file(name)
        with open(path, "wb") as fh:
            block = bytearray()
            for record in _distinct(runs, self._width):
                block += record
                if len(block) >= READ_RECORDS * self._width:
                    fh.write(block)
                    block.clear()
            fh.write(block)
        for run in runs:
            if isinstance(run, Path):
                run.unlink(missing_ok=True)
        return path

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def capped_lines(stream: IO[bytes], max_line_bytes: int | None) -> Iterator[bytes]:
    """The lines of a binary stream (ending at a newline, as iterating the stream gives
    them), each read with at most ``max_line_bytes`` (and its newline) in memory: a longer line is
    :class:`DataError` naming it. ``None``: no limit."""
    if max_line_bytes is None:
        yield from stream
        return
    number = 0
    while line := stream.readline(max_line_bytes + 1):
        number += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            raise DataError(
                f"line {number}: longer than {max_line_bytes} bytes, the longest line an "
                "upload may hold"
            )
        yield line


class _Spools:
    """What one pass over an upload collects: its examples' digests (canonical key), their
    raw-text digests (``legacy``), and for a data set whose lines name users the users' keyed
    digests and each line's (example, user) pair (64-byte records:
    :mod:`service.data.user_groups`)."""

    def __init__(self, spill_dir: Path | None, legacy: bool):
        self.digests = _DigestSpool(spill_dir)
        self.legacy = _DigestSpool(spill_dir) if legacy else None
        self.users = _DigestSpool(spill_dir)
        self.pairs = _DigestSpool(spill_dir, 2 * DIGEST_BYTES)

    def finish(self, n: int, fmt: str, counts: UserCounts | None) -> HashedData:
        return HashedData(
            n,
            fmt,
            self.digests.finish(),
            counts,
            self.legacy.finish() if self.legacy is not None else None,
            self.users.finish() if counts is not None else None,
            self.pairs.finish() if counts is not None else None,
        )

    def close(self) -> None:
        for spool in (self.digests, self.legacy, self.users, self.pairs):
            if spool is not None:
                spool.close()


def user_digest(keyed: Any, field: str, user: str) -> bytes:
    """A user's keyed digest in its namespace (the field naming users): HMAC over the field and
    the id, so that the store never holds a guessable id."""
    mac = keyed.copy()
    mac.update(b"dprc/user\0" + field.encode("utf-8") + b"\0" + user.encode("utf-8"))
    return bytes(mac.digest())


def _keyed(keyed: Any) -> Any:
    """The object to copy for each example's HMAC: OpenSSL's own HMAC state inside ``keyed``
    where :mod:`hmac` holds one (its ``copy`` is one C call, not a Python object's), else
    ``keyed``; the same digests either way."""
    inner = getattr(keyed, "_hmac", None)
    return inner if inner is not None and hasattr(inner, "copy") else keyed


def _hash_lines(
    lines: Iterable[bytes],
    secret: bytes,
    spools: _Spools,
    users: UserCounter,
    user_field: str | None = None,
) -> tuple[int, str, UserCounts | None]:
    """Validate a data set in one pass over its lines (:func:`read_examples`, and the checks of
    :func:`summarize_jsonl`: two examples, two classes) while hashing its examples into
    ``spool`` and counting its users in ``users``; (number of examples, format, users).
    ``user_field``: every line must name its user there; without it a line may name its user
    in ``user_id``, and then every line must (a data set's lines all name their users or none
    does). ``legacy``: also the raw-text hashes, there. Memory: the current line, one digest run
    (two with ``legacy``) and the user counter's bound."""
    n, fmt, first_label, classes = 0, None, None, 0
    named: int | None = None  # the first line's number, and whether it named a user
    with_users = False
    keyed = hmac.new(secret, digestmod=hashlib.sha256)
    base = _keyed(keyed)
    add, legacy = spools.digests.add, spools.legacy
    for kind, text, label, user in read_fields(lines, user_field):
        n, fmt = n + 1, kind
        if named is None:
            named, with_users = n, user is not None
        elif (user is not None) != with_users:
            field_name = user_field or DEFAULT_USER_FIELD
            raise DataError(
                f"example {n}: "
                + ("names no user" if with_users else f"names its user in {field_name!r}")
                + f" while example {named} "
                + ("does" if with_users else "does not")
                + f": either every line names its user in {field_name!r} (user-level DP, "
                "docs/privacy_unit.md) or none does"
            )
        if user is not None:
            users.add(user)
        if label is not None and classes < 2:
            name = str(label)  # label_names compares labels as strings: 1 and "1" are one
            if first_label is None:
                first_label, classes = name, 1
            elif name != first_label:
                classes = 2
        mac = base.copy()
        mac.update(canonical_text(text).encode("utf-8"))
        digest = mac.digest()
        add(digest)
        if legacy is not None:
            raw = base.copy()
            raw.update(text.encode("utf-8"))
            legacy.add(raw.digest())
        if user is not None:
            who = user_digest(keyed, user_field or DEFAULT_USER_FIELD, user)
            spools.users.add(who)
            spools.pairs.add(digest + who)
    if fmt is None:
        raise DataError("the file holds no examples")
    if n < MIN_EXAMPLES:
        raise DataError(f"a data set needs at least {MIN_EXAMPLES} examples, this one has {n}")
    if fmt == "classification" and classes < 2:
        raise DataError(
            f"a classification data set needs at least 2 classes, this one has {classes}"
        )
    counts = None
    if with_users:
        n_users, most = users.finish()
        if n_users < MIN_EXAMPLES:
            raise DataError(
                f"a user-level data set needs at least {MIN_EXAMPLES} users, this one has {n_users}"
            )
        counts = UserCounts(user_field or DEFAULT_USER_FIELD, n_users, most)
    return n, fmt, counts


def hash_examples(
    data: bytes, secret: bytes, user_field: str | None = None, legacy: bool = False
) -> HashedData:
    """Validate a fine-tune JSONL file held in memory (the worker's own reader,
    :func:`dprc_core.training.data.read_examples`, with the checks of ``summarize_jsonl``) and
    hash its examples (and count its users: ``user_field``, as in :func:`_hash_lines`); a bad
    line is :class:`InvalidInput` (400, ``param: file``) naming it."""
    spools = _Spools(None, legacy)
    try:
        n, fmt, users = _hash_lines(io.BytesIO(data), secret, spools, UserCounter(None), user_field)
    except DataError as exc:
        raise InvalidInput(str(exc), param="file", code="invalid_jsonl") from exc
    return spools.finish(n, fmt, users)


# A big file is hashed by worker processes (PARALLEL_MIN_BYTES and more, at most HASH_WORKERS,
# never more than the CPUs this process may use): each hashes a range of whole lines into
# sorted distinct runs, one per bucket of the digests' first byte, then each merges one bucket
# of every range; the buckets, concatenated in order, are the file's sorted distinct digests.
# Their memory is the workers' (returned when they exit), not the API's. What one pass decides
# about the whole file (one format, two classes, at least two examples) is decided from the
# ranges' answers; a range that meets a bad line, or a line naming a user, gives up, and the
# file is hashed again in this process (so that an error names its line exactly as it always
# did). The workers run at the API's priority plus WORKER_NICE (0: the same; a higher value
# lets the API's requests go first, but on a machine shared with other work it starves them).
PARALLEL_MIN_BYTES = 32 << 20
HASH_WORKERS = 4
WORKER_NICE = 0
WORKER_RUN_RECORDS = 1 << 18  # a worker's runs, all buckets together (~8 MB)
BUCKETS_PER_WORKER = 8  # buckets of the digests' first byte: small enough to merge in memory
WORKER_MERGE_BYTES = 64 << 20  # a bucket's runs up to this size are merged in memory (numpy)


@dataclass(frozen=True)
class _Range:
    """What a worker found in its range of lines."""

    n: int
    format: str | None
    first_label: str | None
    classes: int
    buckets: list[bytes | Path]  # each bucket's sorted distinct digests


def _worker_start() -> None:
    if not WORKER_NICE:
        return
    try:
        os.nice(WORKER_NICE)
    except OSError:  # pragma: no cover - not permitted: stay at the API's priority
        pass


def _range_lines(path: Path, start: int, stop: int, max_line_bytes: int | None) -> Iterator[bytes]:
    """The lines that begin in ``[start, stop)`` (``start`` begins one)."""
    cap = -1 if max_line_bytes is None else max_line_bytes + 1
    with open(path, "rb") as fh:
        fh.seek(start)
        at = start
        while at < stop and (line := fh.readline(cap)):
            if (
                max_line_bytes is not None
                and len(line) > max_line_bytes
                and not line.endswith(b"\n")
            ):
                raise DataError("a line longer than the limit")  # named again by the serial pass
            at += len(line)
            yield line


def _hash_range(
    path: Path,
    start: int,
    stop: int,
    secret: bytes,
    folder: Path,
    max_line_bytes: int | None,
    buckets: int,
) -> _Range | None:
    """A worker's range of lines hashed into ``buckets`` spools (in ``folder``); None when it
    meets a bad line or a line naming its user (the file is then hashed in one pass)."""
    run_records = max(1024, WORKER_RUN_RECORDS // buckets)
    spools = [
        _DigestSpool(folder, run_records=run_records, merge_bytes=WORKER_MERGE_BYTES)
        for _ in range(buckets)
    ]
    adds = [spool.add for spool in spools]
    base = _keyed(hmac.new(secret, digestmod=hashlib.sha256))
    n, fmt, first_label, classes = 0, None, None, 0
    try:
        lines = _range_lines(path, start, stop, max_line_bytes)
        for kind, text, label, user in read_fields(lines):
            if user is not None:
                return None
            n, fmt = n + 1, kind
            if label is not None and classes < 2:
                name = str(label)
                if first_label is None:
                    first_label, classes = name, 1
                elif name != first_label:
                    classes = 2
            mac = base.copy()
            mac.update(canonical_text(text).encode("utf-8"))
            digest = mac.digest()
            adds[digest[0] * buckets >> 8](digest)
    except DataError:
        return None
    out: list[bytes | Path] = []
    for spool in spools:
        done = spool.finish()
        out.append(done._source)
        spool._folder = None  # its files are the parent's now (it removes ``folder``)
    return _Range(n, fmt, first_label, classes, out)


def _merge_bucket(runs: list[bytes | Path], target: Path) -> int:
    """The distinct records of a bucket's sorted runs written to ``target``; how many."""
    if _run_bytes(runs) <= WORKER_MERGE_BYTES:
        return _merge_in_memory(runs, target, DIGEST_BYTES)
    count = 0
    with open(target, "wb") as fh:
        block = bytearray()
        for record in _distinct(runs, DIGEST_BYTES):
            block += record
            count += 1
            if len(block) >= READ_RECORDS * DIGEST_BYTES:
                fh.write(block)
                block.clear()
        fh.write(block)
    for run in runs:
        if isinstance(run, Path):
            run.unlink(missing_ok=True)
    return count


def _cuts(path: Path, parts: int) -> list[int]:
    """Offsets that split the file into ``parts`` ranges of whole lines."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as fh:
        for i in range(1, parts):
            fh.seek(max(size * i // parts, cuts[-1]))
            fh.readline()
            at = fh.tell()
            if at < size and at > cuts[-1]:
                cuts.append(at)
    return [*cuts, size]


def hash_workers() -> int:
    """How many worker processes hash a big file here."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(HASH_WORKERS, cpus))


def _hash_parallel(
    path: Path, secret: bytes, folder: Path, max_line_bytes: int | None, workers: int
) -> HashedData | None:
    """:func:`hash_file`'s pass by ``workers`` processes (the digests in ``folder``); None
    when the file must be hashed in one pass (a range gave up, or formats differ)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    cuts = _cuts(path, workers)
    buckets = workers * BUCKETS_PER_WORKER
    context = multiprocessing.get_context("spawn")  # no fork of a threaded server
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start) as pool:
        ranges = list(
            pool.map(
                _hash_range,
                *zip(
                    *[
                        (path, a, b, secret, folder, max_line_bytes, buckets)
                        for a, b in zip(cuts, cuts[1:], strict=False)
                    ],
                    strict=True,
                ),
            )
        )
        if any(r is None for r in ranges):
            return None
        found = [r for r in ranges if r is not None and r.format is not None]
        formats = {r.format for r in found}
        if len(formats) > 1:
            return None
        targets = [folder / f"bucket-{b}" for b in range(buckets)]
        counts = list(
            pool.map(
                _merge_bucket,
                [[r.buckets[b] for r in found] for b in range(buckets)],
                targets,
            )
        )
    n = sum(r.n for r in found)
    fmt = found[0].format if found else None
    if fmt is None:
        raise DataError("the file holds no examples")
    if n < MIN_EXAMPLES:
        raise DataError(f"a data set needs at least {MIN_EXAMPLES} examples, this one has {n}")
    labels = {r.first_label for r in found if r.first_label is not None}
    classes = 2 if len(labels) > 1 or any(r.classes >= 2 for r in found) else len(labels)
    if fmt == "classification" and classes < 2:
        raise DataError(
            f"a classification data set needs at least 2 classes, this one has {classes}"
        )
    final = folder / "digests"
    with open(final, "wb") as out:
        for target in targets:
            with open(target, "rb") as part:
                shutil.copyfileobj(part, out, 1 << 20)
            target.unlink()
    return HashedData(n, fmt, Digests(final, sum(counts)))


@contextmanager
def hash_file(
    path: Path,
    secret: bytes,
    spill_dir: Path,
    max_line_bytes: int | None = None,
    user_field: str | None = None,
    legacy: bool = False,
) -> Iterator[HashedData]:
    """:func:`hash_examples` of a file on disk, streamed: memory is bounded by one line (at
    most ``max_line_bytes``; None: no limit) and one run of digests, whatever the file's size;
    the digests beyond one run go to a folder made in ``spill_dir`` (32 bytes an example),
    removed when the context ends. A bad line is :class:`InvalidInput` naming it."""
    workers = hash_workers()
    if (
        workers > 1
        and not legacy
        and user_field is None
        and path.stat().st_size >= PARALLEL_MIN_BYTES
    ):
        folder = Path(tempfile.mkdtemp(dir=spill_dir, prefix=".digests-"))
        try:
            try:
                hashed = _hash_parallel(path, secret, folder, max_line_bytes, workers)
            except DataError as exc:
                raise InvalidInput(str(exc), param="file", code="invalid_jsonl") from exc
            except (OSError, BrokenProcessPool):  # no worker could start or one died
                log.warning("hashing %s in worker processes failed; in one pass", path.name)
                hashed = None
            if hashed is not None:
                yield hashed
                return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    spools, users = _Spools(spill_dir, legacy), UserCounter(spill_dir)
    try:
        try:
            with open(path, "rb") as fh:
                lines = capped_lines(fh, max_line_bytes)
                n, fmt, counts = _hash_lines(lines, secret, spools, users, user_field)
        except DataError as exc:
            raise InvalidInput(str(exc), param="file", code="invalid_jsonl") from exc
        yield spools.finish(n, fmt, counts)
    finally:
        spools.close()
        users.close()
