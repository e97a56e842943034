"""How many users a data set holds, and the most lines one of them has (user-level DP,
docs/privacy_unit.md), counted while an upload is validated.

Users are counted by the key the worker samples them by
(:func:`dprc_core.training.token_store.user_key`: 62 bits of SHA-256 of the id), so the U an
upload reports is the U the planner and the runner use. Beside each line's key its id's
128-bit hash (:func:`~dprc_core.training.token_store.user_id_hash`) is kept, so the distinct
ids are counted too: a data set with more distinct ids than distinct keys (two people sharing
a key, who would be merged into one unit) is refused, ``user_key_collision``
(:func:`~dprc_core.training.token_store.check_user_keys`). Memory is bounded whatever the data
set's size: lines are kept in memory up to ``MEMORY_KEYS`` (24 bytes each: the key and the id
hash); beyond that they are spread over ``PARTITIONS`` pairs of files by key (in a folder made
in the caller's ``spill_dir``), and each partition is counted on its own — a key's lines, and
so the ids sharing a key, are all in one partition (a partition of a 10⁸-line data set is
~9 MB).
"""

from __future__ import annotations

import shutil
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dprc_core.training.token_store import (
    check_user_keys,
    count_user_ids,
    user_id_hash,
    user_key,
)

MEMORY_KEYS = 1 << 17
PARTITIONS = 256
BUFFER_KEYS = 1024  # keys a partition buffers before it is written


@dataclass(frozen=True)
class UserCounts:
    """The users of a data set: the field naming them, their number (U, the N of user-level
    accounting) and the largest number of lines one of them has."""

    field: str
    n_users: int
    max_lines_per_user: int


class _Lines:
    """Lines' user keys (int64) and id hashes (16 bytes each), compact and in order."""

    def __init__(self) -> None:
        self.keys = array("q")
        self.ids = bytearray()

    def add(self, key: int, id_hash: bytes) -> None:
        self.keys.append(key)
        self.ids += id_hash

    def __len__(self) -> int:
        return len(self.keys)

    def clear(self) -> None:
        self.keys = array("q")
        self.ids = bytearray()


def _count(keys: np.ndarray, ids: np.ndarray) -> tuple[int, int, int]:
    """(distinct ids, distinct keys, most lines of one key)."""
    return count_user_ids(keys, ids.reshape(-1, 2))


class UserCounter:
    """Counts lines per user key and the distinct ids; :meth:`finish` gives (users, most
    lines of one user), or raises :class:`~dprc_core.training.data.DataError`
    (``user_key_collision``) when distinct ids share a key."""

    def __init__(self, spill_dir: Path | None):
        self._spill_dir = spill_dir
        self._lines = _Lines()
        self._folder: Path | None = None
        self._buffers: list[_Lines] = []

    def add(self, user: str) -> None:
        key, id_hash = user_key(user), user_id_hash(user)
        if self._folder is None:
            self._lines.add(key, id_hash)
            if len(self._lines) >= MEMORY_KEYS and self._spill_dir is not None:
                self._spill()
            return
        buffer = self._buffers[key % PARTITIONS]
        buffer.add(key, id_hash)
        if len(buffer) >= BUFFER_KEYS:
            self._write(key % PARTITIONS)

    def _spill(self) -> None:
        assert self._spill_dir is not None
        self._folder = Path(tempfile.mkdtemp(dir=self._spill_dir, prefix=".users-"))
        self._buffers = [_Lines() for _ in range(PARTITIONS)]
        lines, self._lines = self._lines, _Lines()
        for i, key in enumerate(lines.keys):
            self._buffers[key % PARTITIONS].add(key, bytes(lines.ids[16 * i : 16 * i + 16]))
        for p in range(PARTITIONS):
            self._write(p)

    def _write(self, p: int) -> None:
        assert self._folder is not None
        buffer = self._buffers[p]
        with open(self._folder / f"{p}.i64", "ab") as fh:
            fh.write(buffer.keys.tobytes())
        with open(self._folder / f"{p}.ids", "ab") as fh:
            fh.write(buffer.ids)
        buffer.clear()

    def finish(self) -> tuple[int, int]:
        if self._folder is None:
            n_ids, users, most = _count(
                np.frombuffer(self._lines.keys.tobytes(), dtype=np.int64),
                np.frombuffer(bytes(self._lines.ids), dtype=np.uint64),
            )
            check_user_keys(n_ids, users)
            return users, most
        n_ids, users, most = 0, 0, 0
        for p in range(PARTITIONS):
            self._write(p)
            i, n, m = _count(
                np.fromfile(self._folder / f"{p}.i64", dtype=np.int64),
                np.fromfile(self._folder / f"{p}.ids", dtype=np.uint64),
            )
            n_ids, users, most = n_ids + i, users + n, max(most, m)
        check_user_keys(n_ids, users)
        return users, most

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
