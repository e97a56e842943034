"""The most recently stored values, up to a size: the accountant's small bounded stores.

What the accountant process (:mod:`dprc_core.accounting.accountant_process`) hands back — a
history's grid, an event's step — is kept for this process's caches in such a store, and so is
the record of the history tails this process holds grids for: :class:`Recent` is a
thread-safe map that keeps the ``size`` most recently stored values (one class for every such
store, so that each bounds its memory and locks the same way)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """Stored values by key; beyond ``size`` the least recently stored is dropped."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._guard:
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        with self._guard:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._guard:
            self._items.clear()

    def __len__(self) -> int:
        with self._guard:
            return len(self._items)
