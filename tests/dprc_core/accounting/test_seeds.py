"""The store of values from another process (``dprc_core.accounting.seeds``) keeps the most
recently stored ones, up to its size."""

from __future__ import annotations

import pytest

from dprc_core.accounting.seeds import Seeds


def test_the_least_recently_stored_is_dropped_beyond_the_size() -> None:
    seeds: Seeds[str, int] = Seeds(2)
    seeds.put("a", 1)
    seeds.put("b", 2)
    seeds.put("a", 3)  # stored again: now the most recent
    seeds.put("c", 4)
    assert (seeds.get("a"), seeds.get("b"), seeds.get("c")) == (3, None, 4)
    assert len(seeds) == 2
    seeds.clear()
    assert seeds.get("a") is None and len(seeds) == 0


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Seeds(0)
