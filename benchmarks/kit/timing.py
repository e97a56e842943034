"""Wall-clock helpers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """``fn()``'s wall seconds and its value."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def repeat_timed(fn: Callable[[], object], repeat: int) -> list[float]:
    """The wall seconds of ``repeat`` calls of ``fn``, one by one."""
    return [timed(fn)[0] for _ in range(repeat)]
