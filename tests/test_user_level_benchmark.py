"""benchmarks/user_level.py's group-privacy conversion and users' sizes (benchmarks.kit.
group_privacy), checked against independent computations (no training)."""

from __future__ import annotations

import math

import pytest

from benchmarks.kit import group_privacy as ul


def _chain(eps: float, delta: float, k: int) -> tuple[float, float]:
    """Group privacy by walking the k neighbouring data sets one at a time: after j steps the
    bound is (j·ε, δ_j) with δ_{j+1} = e^ε·δ_j + δ (the proof of the lemma, step by step)."""
    e, d = eps, delta
    for _ in range(k - 1):
        e, d = e + eps, math.exp(eps) * d + delta
    return e, d


@pytest.mark.parametrize("k", [1, 2, 7, 200])
@pytest.mark.parametrize("eps_user", [0.5, 1.0, 3.0, 8.0])
def test_the_example_budget_composes_back_to_the_user_budget(eps_user, k):
    delta_user = 5e-4
    eps_ex, delta_ex = ul.group_privacy_example_budget(eps_user, delta_user, k)
    eps_k, delta_k = _chain(eps_ex, delta_ex, k)
    assert eps_k == pytest.approx(eps_user, rel=1e-12)
    assert delta_k == pytest.approx(delta_user, rel=1e-9)
    # never below the simplified lemma's δ/(k·e^{(k−1)ε}): the exact sum is at most k·e^{(k−1)ε}
    assert delta_ex >= delta_user / (k * math.exp((k - 1) * eps_ex)) * (1 - 1e-12)


def test_one_line_a_user_is_example_level():
    assert ul.group_privacy_example_budget(3.0, 1e-5, 1) == pytest.approx((3.0, 1e-5))


def test_the_users_sizes_run_from_one_to_the_largest():
    sizes = ul.user_sizes(1000, 200)
    assert len(sizes) == 1000 and max(sizes) == sizes[0] == 200 and min(sizes) == 1
    assert sizes[:4] == [200, 100, 66, 50]
    assert sorted(sizes, reverse=True) == sizes
    assert sum(sizes) == 1898
