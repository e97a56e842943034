"""The ε lower bound implied by one-run canary guesses (Steinke, Nasr & Jagielski 2023).

Reference: T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023, arXiv:2305.08846 — §5 (analysis), Corollary 5.4 (the bound for
(ε, δ)-DP), and the p-value / ε-search routine of its Appendix D, which this module
re-implements (own code, exact binomial arithmetic from scipy).

Setting. m canaries; canary i is included in the training data iff S_i = +1, with
S_1 … S_m i.i.d. uniform on {−1, +1}. The auditor sees the released output, makes r guesses
T_i ∈ {−1, +1} (abstaining on the other m − r canaries) and counts the correct ones, W. If the
training algorithm is (ε, δ)-DP with respect to adding / removing one canary, then for every v

    P[W ≥ v] ≤ P[Binomial(r, p_ε) ≥ v] + 2 m δ · max_{1≤i≤v} P[v − i ≤ Binomial(r, p_ε) < v] / i,

with p_ε = e^ε / (1 + e^ε) (the accuracy of ε-randomized response). The right-hand side is a
valid p-value for the null hypothesis "the algorithm is (ε, δ)-DP"; it decreases as ε grows.
The **lower bound at confidence 1 − α** is the largest ε at which the observation still
rejects the null at level α: every ε' below it is refuted. It is a *lower* bound on the true
privacy loss, never a proof of privacy (docs/auditing.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


def _check_counts(m: int, r: int, v: int) -> None:
    for name, x in (("m", m), ("r", r), ("v", v)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {x!r}")
    if not v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of ``v`` correct guesses out of ``r`` (``m`` canaries) under (ε, δ)-DP."""
    _check_counts(m, r, v)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, p))  # P[Bin(r, p) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    # P[v - i <= Bin < v] = P[Bin >= v - i] - P[Bin >= v]
    window = stats.binom.sf(v - i - 1, r, p) - tail
    alpha = float(np.max(np.maximum(window, 0.0) / i))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(
    m: int,
    r: int,
    v: int,
    delta: float,
    confidence: float = 0.95,
    eps_max: float = 100.0,
    iterations: int = 60,
) -> float:
    """Largest ε (to bisection precision, rounded down) that ``v`` correct guesses out of ``r``
    refute at ``confidence``: ``p_value(m, r, v, ε, δ) < 1 − confidence``. 0 if none."""
    level = 1.0 - confidence
    if not 0 < level < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0  # invariant: p(lo) < level <= p(hi)
    while p_value(m, r, v, hi, delta) < level:
        lo, hi = hi, 2 * hi
        if hi > eps_max:
            return lo  # refutes everything up to eps_max: report the last verified value
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower: float  # ε lower bound at `confidence` (0 when nothing is refuted)
    m: int  # canaries
    included: int  # canaries with S_i = +1
    guesses: int  # r, the guesses of the best guess count
    correct: int  # v
    confidence: float
    delta: float
    candidates: tuple[int, ...]  # the guess counts tried (Bonferroni over them)


def audit_scores(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
    guess_counts: Sequence[int] | None = None,
) -> AuditResult:
    """The one-run audit from per-canary scores (higher = "looks included").

    For each guess count r in ``guess_counts`` (fixed **before** looking at the scores) the
    auditor guesses "included" for the r/2 highest and "excluded" for the r/2 lowest scores
    (abstaining on the rest) and counts the correct guesses. Trying several r is multiple
    testing, so each is tested at level (1 − confidence)/len(guess_counts) (Bonferroni): the
    maximum over them is still a lower bound at ``confidence``. Ties in the scores are broken
    by a fixed-seed random order, never by the labels.
    """
    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    m = int(s.shape[0])
    if inc.shape != s.shape or m < 2:
        raise ValueError("scores and included must be 1-D of the same length >= 2")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    if guess_counts is None:
        guess_counts = sorted({max(2, 2 * (m * f // 200)) for f in (10, 20, 40, 100)})
    counts = tuple(int(r) for r in guess_counts)
    if any(r < 2 or r > m or r % 2 for r in counts):
        raise ValueError(f"guess counts must be even and in [2, m={m}], got {counts}")
    tiebreak = np.random.default_rng(0).permutation(m)
    order = np.lexsort((tiebreak, s))  # ascending score
    adj_conf = 1.0 - (1.0 - confidence) / len(counts)
    best = (0.0, counts[0], 0)
    for r in counts:
        half = r // 2
        correct = int((~inc[order[:half]]).sum() + inc[order[m - half :]].sum())
        eps = epsilon_lower_bound(m, r, correct, delta, adj_conf)
        if eps > best[0] or (eps == best[0] and best[2] == 0):
            best = (eps, r, correct)
    return AuditResult(best[0], m, int(inc.sum()), best[1], best[2], confidence, delta, counts)
