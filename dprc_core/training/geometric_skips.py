"""Poisson sampling by geometric skips: one step's batch in O(batch) time and memory, with
exactly the law of one independent coin per example (proof: docs/accounting.md §12).

**The rate.** The inclusion probability is the dyadic ``p = t / 2^bits`` with ``t = ⌊q·2^bits⌋``
(``bits`` = 53 for torch's generator, 64 for the ChaCha20 stream), so ``p ≤ q`` exactly and
``q − p < 2^-bits``; :func:`rate_threshold` computes ``t`` in rational arithmetic.

**The skips.** Instead of N coins, draw the gaps between included examples: ``G`` = the number
of examples skipped before the next included one, ``P(G ≥ k) = s^k`` with ``s = 1 − p``. For
i.i.d. such gaps the positions ``G₁, G₁ + 1 + G₂, …`` (below N) are exactly the included set of
N independent Bernoulli(p) coins (memorylessness of the geometric law). A gap comes from a
uniform ``U`` on [0, 1) whose binary expansion is the word source's words, drawn lazily:
``G = #{k ≥ 1 : U < s^k}``, i.e. ``G ≥ k ⟺ U < s^k``, so ``P(G ≥ k) = s^k`` exactly.

**Exactly, not in floating point.** The first word fixes ``U`` to an interval
``[a, a + 2⁻⁵³)`` (its top 53 bits). ``x(U) = ln U / ln s`` is computed in float64 at both ends
and widened by a relative margin of 10⁻¹² (about 4,500 ulp: float64 ``log`` and ``log1p`` are
accurate to 1 ulp, the division to ½ ulp); when no integer lies strictly inside the widened
interval, every ``U`` in it has the same ``G``, which is then read off. Otherwise (about one
gap in 10⁷ at p = 10⁻⁴; and whenever the first 53 bits are 0) ``G`` is found by a binary search
over the few candidate ``k`` with exact comparisons ``U < s^k``: ``s^k`` bracketed by integer
arithmetic with directed rounding at a precision P that doubles until the bracket separates it
from ``U``'s first P bits (at ``P = bits·k`` the bracket is exact, so it always ends).

Gaps are capped at N (any gap ≥ N ends the batch). Words are drawn in a fixed order (a step's
first words for its gaps, then the extra words of the undecided ones, in order), so a seeded
step is reproducible and the same on every rank.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

import numpy as np
import torch

# relative widening of x(U) = ln U / ln s computed in float64 (see the module doc)
FLOAT_MARGIN = 1e-12
_TWO53 = float(2**53)
_FIRST_PRECISION = 128  # bits of s^k and U compared first on the exact path


def rate_threshold(q: float, bits: int) -> int:
    """``⌊q · 2^bits⌋`` exactly (q as the float it is): the rate drawn is this over 2^bits."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")
    return math.floor(Fraction(q) * (1 << bits))


class WordSource(Protocol):
    """Uniform ``bits``-bit words, drawn in order."""

    bits: int

    def draw(self, m: int) -> np.ndarray:
        """The next ``m`` words (uint64 array, each below 2^bits)."""
        ...


class TorchWords:
    """53-bit words from a torch CPU generator: ``torch.rand`` in float64 is ``k · 2⁻⁵³`` with
    ``k`` a uniform 53-bit integer, read back exactly."""

    bits = 53

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def draw(self, m: int) -> np.ndarray:
        u = torch.rand(m, generator=self.generator, dtype=torch.float64)
        return u.mul_(_TWO53).to(torch.int64).numpy().astype(np.uint64)


class _Uniform:
    """A uniform on [0, 1) whose ``bits``-bit words are ``first``, then words drawn from
    ``source`` only when a comparison needs them."""

    def __init__(self, first: int, source: WordSource):
        self.words = [first]
        self.source = source
        self.bits = source.bits

    def top(self, precision: int) -> int:
        """``⌊U · 2^precision⌋``: its first ``precision`` bits."""
        need = -(-precision // self.bits)
        if need > len(self.words):
            self.words.extend(int(w) for w in self.source.draw(need - len(self.words)))
        value = 0
        for w in self.words[:need]:
            value = (value << self.bits) | w
        return value >> (need * self.bits - precision)


def _power_bracket(base: int, bits: int, k: int, precision: int) -> tuple[int, int]:
    """Integers ``lo ≤ (base / 2^bits)^k · 2^precision ≤ hi`` (``precision ≥ bits``): binary
    powering in fixed point, products rounded down for ``lo`` and up for ``hi``. Exact
    (``lo == hi``) when ``precision ≥ bits · k``."""
    b_lo = b_hi = base << (precision - bits)
    r_lo = r_hi = 1 << precision
    e = k
    while e:
        if e & 1:
            r_lo = (r_lo * b_lo) >> precision
            r_hi = -((-(r_hi * b_hi)) >> precision)
        e >>= 1
        if e:
            b_lo = (b_lo * b_lo) >> precision
            b_hi = -((-(b_hi * b_hi)) >> precision)
    return r_lo, r_hi


def below_power(u: _Uniform, base: int, k: int) -> bool:
    """Exactly whether ``U < (base / 2^bits)^k``."""
    if k <= 0:
        return True
    bits = u.bits
    exact = bits * k
    precision = min(max(_FIRST_PRECISION, bits), exact) if exact >= bits else bits
    while True:
        lo, hi = _power_bracket(base, bits, k, precision)
        top = u.top(precision)
        if top + 1 <= lo:  # U < (top + 1) / 2^P ≤ lo / 2^P ≤ s^k
            return True
        if top >= hi:  # U ≥ top / 2^P ≥ hi / 2^P ≥ s^k
            return False
        if precision >= exact:  # pragma: no cover  (lo == hi there: one test above holds)
            raise AssertionError("an exact bracket must decide")
        precision = min(2 * precision, exact)


def exact_gap(u: _Uniform, base: int, low: int, high: int) -> int:
    """``G = #{k ≥ 1 : U < s^k}`` given ``low ≤ G`` and ``G ≤ high`` (both ≥ 0), capped at
    ``high``: the largest k in [low, high] with U < s^k (binary search, exact comparisons)."""
    while low < high:
        mid = (low + high + 1) // 2
        if below_power(u, base, mid):
            low = mid
        else:
            high = mid - 1
    return low


def log_survival(threshold: int, bits: int) -> float:
    """``ln s`` for ``s = 1 − threshold / 2^bits`` in float64, to about 1 ulp: ``log1p(−p)`` for
    p ≤ ½ (p rounded once), else ``log(s)`` of ``s`` rounded once (both well conditioned)."""
    if 2 * threshold <= 1 << bits:
        return math.log1p(-(threshold / (1 << bits)))
    return math.log(((1 << bits) - threshold) / (1 << bits))


def gaps(words: np.ndarray, source: WordSource, threshold: int, cap: int) -> torch.Tensor:
    """The gaps (int64, each capped at ``cap``) of the uniforms whose first words are ``words``;
    undecided ones draw their further words from ``source`` in order."""
    bits = source.bits
    base = (1 << bits) - threshold  # s = base / 2^bits
    log_s = log_survival(threshold, bits)
    hi53 = torch.from_numpy((words >> np.uint64(bits - 53)).astype(np.int64))
    a = hi53.to(torch.float64).div_(_TWO53)  # U ∈ [a, a + 2⁻⁵³)
    b = a + 1.0 / _TWO53
    x_low = torch.log(b).div_(log_s).mul_(1.0 - FLOAT_MARGIN)  # ≤ x(b) < x(U)
    x_high = torch.log(a).div_(log_s).mul_(1.0 + 2.0 * FLOAT_MARGIN)  # ≥ x(a) ≥ x(U); a = 0: inf
    floor_low = torch.floor(x_low)
    decided = x_high <= floor_low + 1.0  # no integer strictly inside (x_low, x_high)
    out = floor_low.clamp_(max=float(cap)).to(torch.int64)
    for i in torch.nonzero(~decided).flatten().tolist():
        high = x_high[i].item()
        high_k = cap if not math.isfinite(high) else min(math.ceil(high) - 1, cap)
        low_k = min(int(out[i]), high_k)
        out[i] = exact_gap(_Uniform(int(words[i]), source), base, low_k, high_k)
    return out


def poisson_positions(n: int, threshold: int, source: WordSource) -> torch.Tensor:
    """The included positions (int64, increasing) among ``n``, each independently with
    probability ``threshold / 2^bits``: geometric skips, words from ``source``."""
    bits = source.bits
    if threshold >= 1 << bits:
        return torch.arange(n)
    if threshold <= 0 or n <= 0:
        return torch.zeros(0, dtype=torch.long)
    p = threshold / float(1 << bits)
    parts = []
    last = -1  # the last included position so far
    while True:
        expected = (n - 1 - last) * p
        m = int(expected + 6.0 * math.sqrt(expected) + 16)  # gaps enough to pass n, nearly always
        step = gaps(source.draw(m), source, threshold, n) + 1
        positions = torch.cumsum(step, 0).add_(last)
        inside = int(torch.searchsorted(positions, n))  # positions < n: a prefix
        parts.append(positions[:inside])
        if inside < m:
            break
        last = int(positions[-1])
    return torch.cat(parts)


__all__ = [
    "FLOAT_MARGIN",
    "TorchWords",
    "WordSource",
    "below_power",
    "exact_gap",
    "gaps",
    "poisson_positions",
    "rate_threshold",
]
