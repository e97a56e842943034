"""A tokenized data set on disk: a flat token array and offsets, memory-mapped, built once per
(file content, tokenizer, ``max_seq_len``, task, classes) and reused by every later job.

Layout of one store, ``<root>/<key>/``:

* ``tokens.u32`` — every example's token ids, end to end (``uint32``);
* ``offsets.i64`` — N + 1 offsets into ``tokens`` (example i is ``tokens[off[i]:off[i+1]]``);
  a store of preference pairs (``rows_per_example`` 2 in ``meta.json``) holds two sequences an
  example, 2N + 1 offsets: pair i's preferred sequence is 2i, its non-preferred one 2i + 1;
* ``labels.i32`` — the class index of each example (classification only);
* ``trained.u8`` — one byte a token, 1 where the token is trained (chat and prompt-completion
  lines only, docs/data.md "Chat lines"; a text line trains every token): batches carry
  per-token ``labels``, the ids with -100 where a token is not trained or is padding;
* ``users.i64`` — each example's user key (user-level DP only: built when the key names a user
  field): the first 62 bits of SHA-256("dprc/user/" + the user's id as in the file), so equal
  ids share a key and the ids themselves are not kept; a build in which two distinct ids
  share a key is refused (``user_key_collision``, :func:`user_key`);
* ``sequences.sha256`` — the distinct SHA-256 digests of the examples' token-id sequences
  (each example's kept ids as little-endian ``uint32``), 32 bytes each, sorted: what the model
  sees of each line, for this tokenizer, whatever the text's spelling. The service keys them
  with its tenant's secret to find a copy of another budget group's data that its canonical
  text key misses (an accent an uncased tokenizer strips, a character it maps to its unknown
  token). Built with the store; a store built before it gets it on first use
  (:func:`ensure_sequence_digests`);
* ``meta.json`` — N, the token count, the pad id, the classes, the key's parts and the
  SHA-256 of each array file.

**Building** reads the JSONL file line by line (:func:`dprc_core.training.data.read_examples`)
and tokenizes ``BUILD_BATCH`` examples at a time with the same truncation windows as
:func:`dprc_core.training.data.truncated_ids` (chat and prompt-completion lines:
:func:`dprc_core.training.data.masked_ids`; a line left with no trained token refuses the
build, naming the line), appending to files in a private temporary
folder; only a complete, fsynced folder is renamed to ``<key>`` (atomic on one file system),
so a build killed at any point leaves nothing a later job would open (its temporary folder is
removed by the next build of that key). Builds of one key take turns through an ``flock`` on
``<key>.lock``: a second process waiting for it finds the finished store and reuses it.
Memory while building: one batch of texts and ids, for classification the distinct labels,
and with a user field, at the end, each line's user key and id hash (24 bytes a line, read
back from the build folder) to count the distinct ids against the distinct keys.

**Opening** checks every array file's SHA-256 against ``meta.json``; a store that fails (a
truncated or altered file) is moved aside and rebuilt, never used. Batches are sliced from
the memory maps: the resident memory of a job's data is at most the pages it touched
(≤ 5 bytes a token, 8 an example, 4 a label), never a Python list per example.

**The key** is the SHA-256 of: the file's content (SHA-256, streamed), the tokenizer's
fingerprint (its full serialized definition for a fast tokenizer, else its vocabulary and
special tokens, plus its class, truncation side and the pad id used), ``max_seq_len``, the
task, the classes when given, for a causal LM what chat and prompt-completion lines are
rendered with (:func:`dprc_core.training.chat_template.chat_template_key`: the tokenizer's own
chat template, the default, the special tokens), and ``STORE_VERSION``. Anything that could
change one token id, or which tokens are trained, changes the key.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import heapq
import itertools
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dprc_core.training.chat_template import chat_template_key
from dprc_core.training.data import (
    MASKED_FORMATS,
    PREFERENCE_FORMAT,
    DataError,
    Example,
    label_names,
    masked_ids,
    pair_batch,
    read_examples,
    token_labels,
    truncated_ids,
)

STORE_VERSION = 2  # 2: chat templates and trained.u8 (a store of version 1 is rebuilt)
BUILD_BATCH = 1024
MAX_CLASSES = 100_000
_CHUNK = 1 << 20
BUILDS_LOG = "builds.log"
SEQUENCES = "sequences.sha256"
TRAINED = "trained.u8"
DIGEST_SIZE = 32
SORT_RUN = 1 << 20  # digests sorted in memory at a time (32 MiB); more: merged from runs

Report = Callable[[str], None]


def default_root() -> Path:
    """Where ``dprc train`` keeps its stores: ``$DPRC_TOKEN_STORE``, else
    ``~/.cache/dprc/tokens``."""
    env = os.environ.get("DPRC_TOKEN_STORE")
    return Path(env) if env else Path.home() / ".cache" / "dprc" / "tokens"


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def pad_id_of(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    return int(pad)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of everything that decides the tokenizer's ids (see the module docstring)."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # its definition, less the truncation and padding a call left set on it (each call
        # sets its own: they are not part of what the tokenizer is)
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
        h.update(json.dumps(definition, sort_keys=True).encode())
    else:  # a slow tokenizer: its vocabulary and special tokens
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
        h.update(json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True).encode())
    h.update(type(tokenizer).__name__.encode())
    h.update(str(getattr(tokenizer, "truncation_side", "right")).encode())
    h.update(str(pad_id_of(tokenizer)).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class StoreKey:
    file_sha256: str
    tokenizer: str
    max_seq_len: int
    task: str
    classes: tuple[str, ...] | None
    user_field: str | None = None  # user-level DP: the field naming each line's user
    chat_template: dict[str, Any] | None = None  # causal LM: chat_template_key(tokenizer)

    def digest(self) -> str:
        parts: dict[str, Any] = {
            "version": STORE_VERSION,
            "file": self.file_sha256,
            "tokenizer": self.tokenizer,
            "max_seq_len": self.max_seq_len,
            "task": self.task,
            "classes": list(self.classes) if self.classes is not None else None,
        }
        if self.user_field is not None:  # (absent: the keys of stores built before users)
            parts["user_field"] = self.user_field
        if self.chat_template is not None:
            parts["chat_template"] = self.chat_template
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def store_key(
    path: str | Path,
    tokenizer: Any,
    max_seq_len: int,
    task: str,
    classes: Sequence[str] | None,
    user_field: str | None = None,
) -> StoreKey:
    """The key of the store of ``path`` for this tokenizer and settings (the module
    docstring: what it holds)."""
    return StoreKey(
        file_sha256(path),
        tokenizer_fingerprint(tokenizer),
        max_seq_len,
        task,
        tuple(classes) if classes is not None else None,
        user_field,
        chat_template_key(tokenizer) if task == "causal_lm" else None,
    )


class TokenStore:
    """A built store, memory-mapped: ``len()`` and ``batch(index)`` as
    :class:`dprc_core.training.data.TokenizedData`."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta
        self.n = int(meta["n_examples"])
        # preference pairs: 2 sequences an example (2i preferred, 2i + 1 not)
        self.rows_per_example = int(meta.get("rows_per_example", 1))
        self.n_rows = self.n * self.rows_per_example
        self.pad_id = int(meta["pad_id"])
        self.classes: list[str] | None = meta["classes"]
        self._offsets = _map(path / "offsets.i64", np.int64, self.n_rows + 1)
        self._tokens = _map(path / "tokens.u32", np.uint32, int(meta["n_tokens"]))
        classification = meta["task"] == "classification"
        self._labels = _map(path / "labels.i32", np.int32, self.n) if classification else None
        with_users = meta.get("user_field") is not None
        self._users = _map(path / "users.i64", np.int64, self.n) if with_users else None
        self.format: str | None = meta.get("format")
        masked = self.format in MASKED_FORMATS
        n_tokens = int(meta["n_tokens"])
        self._trained = _map(path / TRAINED, np.uint8, n_tokens) if masked else None

    def __len__(self) -> int:
        return self.n

    @property
    def tokenizer(self) -> str:
        """The fingerprint of the tokenizer the store was built with
        (:func:`tokenizer_fingerprint`)."""
        return str(self.meta["tokenizer"])

    @property
    def n_sequences(self) -> int:
        """How many distinct token-id sequences the examples hold."""
        return int(self.meta["n_sequences"])

    def sequence_digests(self, chunk: int = 4096) -> Iterator[list[bytes]]:
        """The distinct digests of the examples' token-id sequences (:func:`sequence_digest`),
        sorted, ``chunk`` at a time (memory: one chunk)."""
        with open(self.path / SEQUENCES, "rb") as f:
            while block := f.read(chunk * DIGEST_SIZE):
                yield [block[j : j + DIGEST_SIZE] for j in range(0, len(block), DIGEST_SIZE)]

    def example_with_sequence(self, digest: bytes) -> int | None:
        """The index of the first example one of whose token-id sequences has ``digest``
        (None: none); reads the sequences one by one (for a message, not a lookup)."""
        for i, d in enumerate(_example_digests(self._tokens, self._offsets, self.n_rows)):
            if d == digest:
                return i // self.rows_per_example
        return None

    def ids(self, i: int) -> list[int]:
        """Sequence ``i``'s token ids (an example's; a pair's sequences are 2i and 2i + 1)."""
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._tokens[lo:hi].astype(np.int64).tolist()

    def trained(self, i: int) -> list[int] | None:
        """Which of example ``i``'s tokens are trained (None: all, a text line's)."""
        if self._trained is None:
            return None
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._trained[lo:hi].astype(np.int64).tolist()

    def users(self) -> torch.Tensor:
        """Each example's user key (N,) — a store built with a user field only."""
        if self._users is None:
            raise ValueError("this tokenized store was built without a user field")
        return torch.from_numpy(np.array(self._users, dtype=np.int64))

    @property
    def labels(self) -> list[int] | None:
        return None if self._labels is None else self._labels.astype(np.int64).tolist()

    def batch(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        """A right-padded batch of the given examples (attention_mask marks real tokens);
        preference pairs as (P, 2, T) tensors (:func:`dprc_core.training.data.pair_batch`)."""
        if self.rows_per_example == 2:
            return pair_batch(self._rows, index)
        return self._rows(index)

    def _rows(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        idx = np.asarray([int(i) for i in index], dtype=np.int64)
        starts, ends = self._offsets[idx], self._offsets[idx + 1]
        lengths = ends - starts
        width = int(lengths.max()) if idx.size else 1
        ids = torch.full((idx.size, max(width, 1)), self.pad_id, dtype=torch.long)
        mask = torch.zeros((idx.size, max(width, 1)), dtype=torch.long)
        trained = torch.zeros((idx.size, max(width, 1)), dtype=torch.bool)
        for row in range(idx.size):
            n = int(lengths[row])
            lo, hi = int(starts[row]), int(ends[row])
            ids[row, :n] = torch.from_numpy(self._tokens[lo:hi].astype(np.int64))
            mask[row, :n] = 1
            if self._trained is not None:
                trained[row, :n] = torch.from_numpy(self._trained[lo:hi] != 0)
        out = {"input_ids": ids, "attention_mask": mask}
        if self._labels is not None:
            out["labels"] = torch.from_numpy(self._labels[idx].astype(np.int64))
        if self._trained is not None:
            out["labels"] = token_labels(ids, trained)
        return out


def _map(path: Path, dtype: Any, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def builds(root: Path, key: StoreKey) -> int:
    """How many times the store of ``key`` was built under ``root`` (its builds log)."""
    log = root / BUILDS_LOG
    if not log.exists():
        return 0
    digest = key.digest()
    return sum(1 for line in log.read_text().splitlines() if line.split(" ")[0] == digest)


def open_or_build(
    path: str | Path,
    tokenizer: Any,
    max_seq_len: int,
    task: str,
    classes: Sequence[str] | None,
    root: str | Path,
    report: Report | None = None,
    user_field: str | None = None,
) -> TokenStore:
    """The store of ``path`` for this tokenizer and settings under ``root``: opened and
    verified if it exists, else built (see the module docstring). ``report`` receives
    progress lines ("tokenized 340,000 of 1,000,000 examples"). ``user_field``: every line
    names its user in that field, kept as ``users.i64`` (user-level DP)."""
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise ValueError(f"max_seq_len must be an integer >= 2, got {max_seq_len!r}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    key = store_key(path, tokenizer, max_seq_len, task, classes, user_field)
    final = root / key.digest()
    store = _open_verified(final, report)
    if store is not None and SEQUENCES in store.meta["sha256"]:
        return store
    with _build_turn(root / f"{key.digest()}.lock"):
        store = _open_verified(final, report)  # built by whoever held the turn before
        if store is not None:
            if SEQUENCES not in store.meta["sha256"]:  # built before the digests were
                store = _add_sequences(store)
            return store
        _remove_stale(root, key.digest())
        with open(root / BUILDS_LOG, "a") as log:
            log.write(f"{key.digest()} {int(time.time())}\n")
        tmp = root / f"{key.digest()}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            _build(Path(path), tokenizer, key, tmp, report)
            os.rename(tmp, final)
            _fsync_dir(root)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    store = _open_verified(final, None)
    if store is None:  # pragma: no cover - a store just built and renamed fails its checksum
        raise RuntimeError(f"the tokenized store {final} failed its checksum right after build")
    return store


@contextlib.contextmanager
def _build_turn(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_stale(root: Path, digest: str) -> None:
    """Temporary folders of earlier builds of this key (killed ones: we hold the turn)."""
    for p in root.glob(f"{digest}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(f"{digest}.bad-*"):
        shutil.rmtree(p, ignore_errors=True)


def _open_verified(final: Path, report: Report | None) -> TokenStore | None:
    meta_path = final / "meta.json"
    if not final.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        ok = (
            all(file_sha256(final / name) == digest for name, digest in meta["sha256"].items())
            and meta.get("version") == STORE_VERSION
        )
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        bad = final.with_name(f"{final.name}.bad-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(OSError):
            os.rename(final, bad)
        if report is not None:
            report("The tokenized data on disk failed its checksum; tokenizing again")
        return None
    if report is not None:
        report(f"Reusing the tokenized data ({meta['n_examples']:,} examples)")
    return TokenStore(final, meta)


def _build(path: Path, tokenizer: Any, key: StoreKey, tmp: Path, report: Report | None) -> None:
    tmp.mkdir()
    total = _count_lines(path)
    need = 2 if key.task == "causal_lm" else 1
    classification = key.task == "classification"
    index: dict[str, int] = (
        {c: j for j, c in enumerate(key.classes)} if key.classes is not None else {}
    )
    n = n_tokens = 0
    rows = 1  # sequences an example: 2 for preference pairs
    fmt: str | None = None
    last_report = time.monotonic()
    sequences = _DigestSorter(tmp)
    with (
        open(tmp / "tokens.u32", "wb") as tokens_f,
        open(tmp / "offsets.i64", "wb") as offsets_f,
        open(tmp / "labels.i32", "wb") as labels_f,
        open(tmp / "users.i64", "wb") as users_f,
        open(tmp / TRAINED, "wb") as trained_f,
        open(tmp / "user-ids.tmp", "wb") as ids_f,
        open(path, "rb") as source,
    ):
        offsets_f.write(np.zeros(1, dtype=np.int64).tobytes())
        texts: list[str] = []
        items: list[Example] = []
        labels: list[Any] = []
        users: list[int] = []
        user_ids = bytearray()  # each line's user_id_hash, checked for key collisions

        def flush() -> None:
            nonlocal n, n_tokens, fmt, rows
            fmt = items[0].format
            rows = 2 if fmt == PREFERENCE_FORMAT else 1
            masks: list[list[int]] | None = None
            if fmt in MASKED_FORMATS:
                pairs = masked_ids(tokenizer, items, key.max_seq_len)
                ids, masks = [p[0] for p in pairs], [p[1] for p in pairs]
            else:
                ids = truncated_ids(tokenizer, texts, key.max_seq_len)
            lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
            short = np.nonzero(lengths < need)[0]
            if short.size:
                i = int(short[0])
                raise DataError(
                    f"example {n + i // rows + 1} tokenizes to {int(lengths[i])} token(s); "
                    f"a {key.task} example needs at least {need}"
                )
            flat = np.concatenate([np.asarray(x, dtype=np.uint32) for x in ids])
            tokens_f.write(flat.tobytes())
            if masks is not None:
                trained_f.write(np.concatenate([np.asarray(m, np.uint8) for m in masks]).tobytes())
            ends = np.cumsum(lengths)
            sequences.add_all(_digests_of(flat, ends - lengths, ends))
            offsets_f.write((n_tokens + np.cumsum(lengths)).astype(np.int64).tobytes())
            if classification:
                labels_f.write(np.asarray(_label_ids(labels, index, key), np.int32).tobytes())
            if key.user_field is not None:
                users_f.write(np.asarray(users, dtype=np.int64).tobytes())
                ids_f.write(user_ids)
            n += len(ids) // rows
            n_tokens += int(lengths.sum())
            texts.clear()
            items.clear()
            labels.clear()
            users.clear()
            user_ids.clear()

        for ex in read_examples(source, key.task, key.user_field):
            texts.append(ex.text)
            items.append(ex)
            labels.append(ex.label)
            if key.user_field is not None:
                assert ex.user is not None  # read_examples requires it
                users.append(user_key(ex.user))
                user_ids += user_id_hash(ex.user)
            if len(texts) >= BUILD_BATCH:
                flush()
                if report is not None and time.monotonic() - last_report >= 1.0:
                    report(f"Tokenized {n:,} of {total:,} examples")
                    last_report = time.monotonic()
        if texts:
            flush()
        for f in (tokens_f, offsets_f, labels_f, users_f, trained_f):
            f.flush()
            os.fsync(f.fileno())
    if n == 0:
        raise DataError("the file holds no examples")
    if key.user_field is not None:
        keys = np.fromfile(tmp / "users.i64", dtype=np.int64)
        ids = np.fromfile(tmp / "user-ids.tmp", dtype=np.uint64).reshape(-1, 2)
        n_ids, n_keys, _ = count_user_ids(keys, ids)
        del keys, ids
        check_user_keys(n_ids, n_keys)
    (tmp / "user-ids.tmp").unlink()
    n_sequences = sequences.finish(tmp / SEQUENCES)
    classes = list(key.classes) if key.classes is not None else None
    if classification and key.classes is None:
        classes = label_names(list(index))
        _relabel(tmp / "labels.i32", n, [classes.index(c) for c in index])
    if not classification:
        (tmp / "labels.i32").unlink()
    if key.user_field is None:
        (tmp / "users.i64").unlink()
    masked = fmt in MASKED_FORMATS
    if not masked:
        (tmp / TRAINED).unlink()
    names = ["tokens.u32", "offsets.i64", SEQUENCES]
    names += [TRAINED] if masked else []
    names += ["labels.i32"] if classification else []
    names += ["users.i64"] if key.user_field is not None else []
    meta = {
        "version": STORE_VERSION,
        "n_examples": n,
        "rows_per_example": rows,
        "n_tokens": n_tokens,
        "n_sequences": n_sequences,
        "pad_id": pad_id_of(tokenizer),
        "task": key.task,
        "format": fmt,
        "max_seq_len": key.max_seq_len,
        "classes": classes,
        "user_field": key.user_field,
        "file_sha256": key.file_sha256,
        "tokenizer": key.tokenizer,
        "sha256": {name: file_sha256(tmp / name) for name in names},
    }
    with open(tmp / "meta.json", "w") as meta_f:
        json.dump(meta, meta_f, indent=1)
        meta_f.flush()
        os.fsync(meta_f.fileno())
    if report is not None:
        report(f"Tokenized {n:,} of {n:,} examples ({n_tokens:,} tokens)")


def sequence_digest(ids: Iterable[int] | np.ndarray) -> bytes:
    """The SHA-256 of one example's token ids, as little-endian ``uint32``: equal ids, equal
    digest, whatever text gave them."""
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).digest()


def _digests_of(flat: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Iterator[bytes]:
    le = flat.astype("<u4", copy=False)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        yield hashlib.sha256(le[a:b].tobytes()).digest()


def _example_digests(tokens: np.ndarray, offsets: np.ndarray, n: int) -> Iterator[bytes]:
    """Each example's :func:`sequence_digest`, in order, from a store's memory maps."""
    for start in range(0, n, BUILD_BATCH):
        stop = min(start + BUILD_BATCH, n)
        lo, hi = int(offsets[start]), int(offsets[stop])
        block = np.asarray(tokens[lo:hi])
        bounds = np.asarray(offsets[start : stop + 1], dtype=np.int64) - lo
        yield from _digests_of(block, bounds[:-1], bounds[1:])


class _DigestSorter:
    """Distinct 32-byte digests, sorted, written to a file: up to ``SORT_RUN`` in memory at a
    time (``numpy.unique`` of ``V32``: bytewise order), more merged from sorted runs written
    beside (``<folder>/sequences.run-<k>``, removed when done)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pending: list[bytes] = []
        self.runs: list[Path] = []

    def add_all(self, digests: Iterable[bytes]) -> None:
        self.pending.extend(digests)
        if len(self.pending) >= SORT_RUN:
            self._spill()

    def _spill(self) -> None:
        run = self.folder / f"sequences.run-{len(self.runs)}"
        with open(run, "wb") as f:
            f.write(self._sorted().tobytes())
        self.runs.append(run)

    def _sorted(self) -> np.ndarray:
        out = np.unique(np.frombuffer(b"".join(self.pending), dtype=f"V{DIGEST_SIZE}"))
        self.pending = []
        return out

    def finish(self, path: Path) -> int:
        """Write the sorted distinct digests to ``path`` (fsynced); returns how many."""
        with open(path, "wb") as out:
            if not self.runs:
                block = self._sorted()
                out.write(block.tobytes())
                count = int(block.size)
            else:
                if self.pending:
                    self._spill()
                count = _merge_distinct([_read_digests(r) for r in self.runs], out)
            out.flush()
            os.fsync(out.fileno())
        for run in self.runs:
            run.unlink()
        return count


def _read_digests(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            for j in range(0, len(block), DIGEST_SIZE):
                yield block[j : j + DIGEST_SIZE]


def _merge_distinct(runs: list[Iterator[bytes]], out: Any) -> int:
    count, last, buf = 0, b"", bytearray()
    for d in heapq.merge(*runs):
        if d != last:
            buf += d
            count += 1
            last = d
            if len(buf) >= _CHUNK:
                out.write(buf)
                buf.clear()
    out.write(buf)
    return count


def _add_sequences(store: TokenStore) -> TokenStore:
    """A store built before ``sequences.sha256``: its digests computed from its arrays and
    added, with their checksum in ``meta.json`` (each written aside and renamed into place;
    the caller holds the key's build turn)."""
    folder = store.path
    for stale in [*folder.glob("sequences.run-*"), *folder.glob("*.tmp-*")]:
        stale.unlink()  # of an earlier try, killed (we hold the turn)
    sorter = _DigestSorter(folder)
    digests = _example_digests(store._tokens, store._offsets, store.n_rows)
    while batch := list(itertools.islice(digests, BUILD_BATCH)):
        sorter.add_all(batch)
    tmp = folder / f"{SEQUENCES}.tmp-{uuid.uuid4().hex[:8]}"
    count = sorter.finish(tmp)
    os.rename(tmp, folder / SEQUENCES)
    meta = dict(store.meta)
    meta["n_sequences"] = count
    meta["sha256"] = {**meta["sha256"], SEQUENCES: file_sha256(folder / SEQUENCES)}
    meta_tmp = folder / f"meta.json.tmp-{uuid.uuid4().hex[:8]}"
    with open(meta_tmp, "w") as meta_f:
        json.dump(meta, meta_f, indent=1)
        meta_f.flush()
        os.fsync(meta_f.fileno())
    os.rename(meta_tmp, folder / "meta.json")
    _fsync_dir(folder)
    return TokenStore(folder, meta)


def user_key(user: str) -> int:
    """A user's key: the first 62 bits of SHA-256("dprc/user/" + id), the id as its text
    (kept as it is: changing it would change every store and resume). The text does not
    carry the id's type, so a data set's ids must all be strings or all integers
    (:func:`dprc_core.training.data.read_examples` refuses a mix: 7 and "7" would share a
    key). Two distinct ids sharing a key (probability about U²/2⁶³ for U users) would be one
    unit to the sampler and the engine, sampled and clipped together — which is NOT safe:
    removing one of the two people can move the merged unit's clipped gradient by up to 2C
    (from C in one direction to C in the opposite one), twice the sensitivity the noise is
    calibrated for. So a collision is counted and refused (:func:`count_user_ids`,
    :func:`check_user_keys`) when an upload's users are counted (``service.data.user_counts``) and
    when a store is built with a user field."""
    digest = hashlib.sha256(b"dprc/user/" + user.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def user_id_hash(user: str) -> bytes:
    """The id itself, for counting distinct ids: 128 bits of SHA-256("dprc/user-id/" + id)
    (a different hash from :func:`user_key`'s, so that two ids sharing a key are told apart
    unless they also share these 128 bits: probability about U²/2¹²⁹). The id's text is the
    typed id because a data set's ids are all of one type."""
    return hashlib.sha256(b"dprc/user-id/" + user.encode()).digest()[:16]


def count_user_ids(keys: np.ndarray, ids: np.ndarray) -> tuple[int, int, int]:
    """(distinct ids, distinct keys, most lines of one key) of lines whose users have the keys
    ``keys`` (N,) int64 and the id hashes ``ids`` (N, 2) uint64 (:func:`user_id_hash`'s 16
    bytes as two words). More distinct ids than keys: some distinct ids share a key
    (:func:`check_user_keys`). Memory: a few copies of the N lines' 24 bytes."""
    n = int(keys.size)
    if n == 0:
        return 0, 0, 0
    order = np.lexsort((ids[:, 1], ids[:, 0], keys))
    k, hi, lo = keys[order], ids[order, 0], ids[order, 1]
    new_key = np.ones(n, dtype=bool)
    new_key[1:] = k[1:] != k[:-1]
    new_id = new_key.copy()  # sorted by key then id: a new id starts a run of equal ids
    new_id[1:] |= (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    starts = np.flatnonzero(new_key)
    most = int(np.diff(np.append(starts, n)).max())
    return int(new_id.sum()), int(starts.size), most


def check_user_keys(n_ids: int, n_keys: int) -> None:
    """Refuse a data set in which distinct user ids share a key (:func:`user_key`): the
    sampler and the engine would merge them into one unit, which is not protected."""
    if n_ids > n_keys:
        raise DataError(
            f"user_key_collision: {n_ids - n_keys} of the data set's {n_ids} distinct user ids "
            f"share a 62-bit user key with another id (only {n_keys} distinct keys): two "
            "people merged into one unit are not protected (docs/privacy_unit.md); rename "
            "one of the colliding ids"
        )


def _label_ids(labels: list[Any], index: dict[str, int], key: StoreKey) -> list[int]:
    """Class indices: of the given classes, or provisional ones in order of appearance."""
    out = []
    for label in labels:
        name = str(label)
        j = index.get(name)
        if j is None:
            if key.classes is not None:
                raise DataError(f"label {name!r} is not one of the classes {list(key.classes)}")
            if len(index) >= MAX_CLASSES:
                raise DataError(f"more than {MAX_CLASSES} distinct labels")
            j = index[name] = len(index)
        out.append(j)
    return out


def _relabel(path: Path, n: int, mapping: list[int]) -> None:
    """Provisional label ids (order of appearance) to their sorted class positions."""
    table = np.asarray(mapping, dtype=np.int32)
    labels = np.memmap(path, dtype=np.int32, mode="r+", shape=(n,))
    for start in range(0, n, _CHUNK):
        labels[start : start + _CHUNK] = table[labels[start : start + _CHUNK]]
    labels.flush()
    del labels


def _count_lines(path: Path) -> int:
    """Non-blank lines (the examples a valid file holds), for progress reports."""
    count = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                count += 1
    return count


def remove_stores_of(root: Path, content_sha256: str) -> int:
    """Remove every store under ``root`` built from a file of this content (the file was
    deleted: what was derived from it goes too); returns how many."""
    removed = 0
    if not root.is_dir():
        return 0
    for meta_path in root.glob("*/meta.json"):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("file_sha256") == content_sha256:
            shutil.rmtree(meta_path.parent, ignore_errors=True)
            removed += 1
    return removed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
