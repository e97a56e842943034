"""User-level privacy from example-level privacy (benchmarks/user_level.py; its test is
tests/test_user_level_benchmark.py): the group-privacy conversion and the users' sizes."""

from __future__ import annotations

import math


def group_privacy_example_budget(
    epsilon_user: float, delta_user: float, k: int
) -> tuple[float, float]:
    """The per-example (ε_ex, δ_ex) whose guarantee, by the group-privacy lemma, is
    (``epsilon_user``, ``delta_user``) for any group of ``k`` examples (a user of at most k
    lines).

    The lemma: an (ε, δ)-DP mechanism is (kε, δ·Σ_{i<k} e^{iε})-DP for data sets that differ
    in k examples — chain the k neighbouring data sets D₀ … D_k:
    P[M(D₀) ∈ S] ≤ e^ε P[M(D₁) ∈ S] + δ ≤ … ≤ e^{kε} P[M(D_k) ∈ S] + δ(1 + e^ε + … + e^{(k−1)ε}).
    The sum is (e^{kε} − 1)/(e^ε − 1) ≤ k·e^{(k−1)ε}, the usual simplified statement; the
    exact sum is used (a slightly larger δ_ex, i.e. less noise for the example-level row).
    Generic (it holds for every mechanism) and loose for the subsampled Gaussian, but it is
    the conversion the issue asks for."""
    if not (isinstance(k, int) and k >= 1):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not (epsilon_user > 0 and 0 < delta_user < 1):
        raise ValueError(f"need ε > 0 and δ in (0, 1), got ({epsilon_user}, {delta_user})")
    eps_ex = epsilon_user / k
    return eps_ex, delta_user * math.expm1(eps_ex) / math.expm1(k * eps_ex)


def user_sizes(users: int, largest: int) -> list[int]:
    """Lines of the r-th largest user, r = 1 … users: max(1, ⌊largest / r⌋) (Zipf's
    rank-size law, exponent 1; the largest user holds exactly ``largest``)."""
    return [max(1, largest // r) for r in range(1, users + 1)]
