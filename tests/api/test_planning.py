"""Planning rules: the default δ and the (pessimistic) step count."""

from __future__ import annotations

import pytest

from api.files.budget import default_delta
from api.jobs.planning import steps_for


@pytest.mark.parametrize("n", [2, 3, 7, 10, 99, 100, 101, 1000, 1800, 12345, 10**6, 10**9])
def test_default_delta(n):
    d = default_delta(n)
    assert 0 < d <= n**-1.1 <= 1 / n
    assert d > n**-1.1 / 10  # rounded down to one significant digit, not further
    assert float(f"{d:.0e}") == d  # a·10^-m


@pytest.mark.parametrize("epochs,n,b", [(1, 100, 10), (3, 100, 7), (2, 1800, 32), (1, 5, 5),
                                        (7, 999, 1), (1, 10**6, 999)])
def test_steps_round_up(epochs, n, b):
    steps = steps_for(epochs, n, b)
    # q = b/n: steps = ceil(epochs / q); expected examples seen cover every epoch
    assert steps * b >= epochs * n
    assert (steps - 1) * b < epochs * n
