"""The accountant's bounded store (``dprc_core.accounting.recent``) keeps the most
recently stored ones, up to its size."""

from __future__ import annotations

import pytest

from dprc_core.accounting.recent import Recent


def test_the_least_recently_stored_is_dropped_beyond_the_size() -> None:
    recent: Recent[str, int] = Recent(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)  # stored again: now the most recent
    recent.put("c", 4)
    assert (recent.get("a"), recent.get("b"), recent.get("c")) == (3, None, 4)
    assert len(recent) == 2
    recent.clear()
    assert recent.get("a") is None and len(recent) == 0


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Recent(0)
