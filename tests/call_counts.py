"""A counter of calls, for tests that bound how much work a path does (compositions of PLD
blocks, leaves built): each named function of ``target`` wrapped for the test's duration."""

from __future__ import annotations

from typing import Any

import pytest


def count_calls(monkeypatch: pytest.MonkeyPatch, target: Any, *names: str) -> dict[str, int]:
    """``target.<name>`` for each of ``names`` replaced (through ``monkeypatch``, so undone at
    the test's end or by ``monkeypatch.undo()``) by a wrapper that counts its calls and calls
    the real one; the counts, by name, which the caller may reset."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(target, name)

        def counting(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(target, name, counting)
    return calls
