"""How many users a data set holds, and the most lines one of them has (user-level DP,
docs/privacy_unit.md), counted while an upload is validated.

Users are counted by the key the worker samples them by
(:func:`dprc_core.training.token_store.user_key`: 62 bits of SHA-256 of the id), so the U an
upload reports is the U the planner and the runner use. Memory is bounded whatever the data
set's size: keys are kept in memory up to ``MEMORY_KEYS`` (8 bytes each); beyond that they are
spread over ``PARTITIONS`` files by key (in a folder made in the caller's ``spill_dir``), and
each partition is counted on its own (a partition of a 10⁸-line data set is ~3 MB).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dprc_core.training.token_store import user_key

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


def _count(keys: np.ndarray) -> tuple[int, int]:
    if keys.size == 0:
        return 0, 0
    _, counts = np.unique(keys, return_counts=True)
    return int(counts.size), int(counts.max())


class UserCounter:
    """Counts lines per user key; :meth:`finish` gives (users, most lines of one user)."""

    def __init__(self, spill_dir: Path | None):
        self._spill_dir = spill_dir
        self._keys: list[int] = []
        self._folder: Path | None = None
        self._buffers: list[list[int]] = []

    def add(self, user: str) -> None:
        key = user_key(user)
        if self._folder is None:
            self._keys.append(key)
            if len(self._keys) >= MEMORY_KEYS and self._spill_dir is not None:
                self._spill()
            return
        buffer = self._buffers[key % PARTITIONS]
        buffer.append(key)
        if len(buffer) >= BUFFER_KEYS:
            self._write(key % PARTITIONS)

    def _spill(self) -> None:
        assert self._spill_dir is not None
        self._folder = Path(tempfile.mkdtemp(dir=self._spill_dir, prefix=".users-"))
        self._buffers = [[] for _ in range(PARTITIONS)]
        keys, self._keys = self._keys, []
        for key in keys:
            self._buffers[key % PARTITIONS].append(key)
        for p in range(PARTITIONS):
            self._write(p)

    def _write(self, p: int) -> None:
        assert self._folder is not None
        with open(self._folder / f"{p}.i64", "ab") as fh:
            fh.write(np.asarray(self._buffers[p], dtype=np.int64).tobytes())
        self._buffers[p].clear()

    def finish(self) -> tuple[int, int]:
        if self._folder is None:
            return _count(np.asarray(self._keys, dtype=np.int64))
        users, most = 0, 0
        for p in range(PARTITIONS):
            self._write(p)
            n, m = _count(np.fromfile(self._folder / f"{p}.i64", dtype=np.int64))
            users, most = users + n, max(most, m)
        return users, most

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
