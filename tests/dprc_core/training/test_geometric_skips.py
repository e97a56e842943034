"""Poisson sampling by geometric skips (dprc_core/training/geometric_skips.py): the law of one
independent coin per example, each at ⌊q·2^bits⌋/2^bits ≤ q, checked against exact rational
references and by statistical tests (binomial on the per-example rate, chi-square on the gaps,
independence of neighbours, the batch size), the union over ranks and exact resume."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats

from dprc_core.distributed import Ranks
from dprc_core.noise.secure_stream import SecureStream
from dprc_core.training import geometric_skips as gs
from dprc_core.training.sampling import PoissonSampler, poisson_indices
from dprc_core.training.secure_sampling import SecurePoissonSampler, StreamWords
from dprc_core.training.user_sampling import SecureUserPoissonSampler, UserIndex

ALPHA = 1e-4  # every statistical test below: false alarm at most this (fixed seeds anyway)


class ListWords:
    """A word source replaying fixed words (the test's own), ``bits`` bits each."""

    def __init__(self, words: list[int], bits: int):
        self.words, self.bits, self.used = list(words), bits, 0

    def draw(self, m: int) -> np.ndarray:
        out = np.array(self.words[self.used : self.used + m], dtype=np.uint64)
        assert len(out) == m, "the test source ran out of words"
        self.used += m
        return out


def _count(v: Fraction, s: Fraction, strict: bool) -> int:
    """#{k ≥ 1 : v < s^k} (``strict``) or #{k ≥ 1 : v ≤ s^k}, by exact rational comparisons
    (0 < v ≤ 1, s < 1; the float estimate only picks where to start)."""

    def holds(k: int) -> bool:
        return v < s**k if strict else v <= s**k

    k = max(0, math.floor(math.log(v) / math.log(s)) - 2)
    while k > 0 and not holds(k):
        k -= 1
    while holds(k + 1):
        k += 1
    return k


def _reference_gap(words: list[int], bits: int, threshold: int) -> int | None:
    """G = #{k ≥ 1 : U < s^k} for U = 0.w₀w₁… when the known words fix it (every U with this
    prefix has the same G), else None."""
    s = Fraction((1 << bits) - threshold, 1 << bits)
    prefix = 0
    for w in words:
        prefix = (prefix << bits) | w
    scale = 1 << (bits * len(words))
    low, high = Fraction(prefix, scale), Fraction(prefix + 1, scale)  # low ≤ U < high
    if low == 0:
        return None  # G unbounded over the prefix
    g_max = _count(low, s, strict=True)  # at U = low
    g_min = _count(high, s, strict=False)  # U < s^k for every U < high ⟺ high ≤ s^k
    return g_min if g_max == g_min else None


@pytest.mark.parametrize("bits", [53, 64])
@pytest.mark.parametrize("q", [0.3, 0.02, 1e-3, 0.5, 0.97, 1 - 2.0**-40])
def test_gaps_equal_an_exact_rational_reference(bits, q, monkeypatch):
    """Each gap equals #{k ≥ 1 : U < s^k} computed with Fractions — on the fast path, and with
    the float margin widened so that most gaps go through the exact path."""
    rng = np.random.default_rng(int(q * 1e6) + bits)
    threshold = gs.rate_threshold(q, bits)
    # the words of 150 uniforms: first words random or at the edges (0, 1, the largest)
    firsts = [int(w) for w in rng.integers(0, 1 << bits, 146, dtype=np.uint64)]
    firsts += [0, 1, (1 << bits) - 1, 1 << (bits - 1)]
    for margin in (gs.FLOAT_MARGIN, 1e-3):
        monkeypatch.setattr(gs, "FLOAT_MARGIN", margin)
        extra = [int(w) for w in rng.integers(0, 1 << bits, 4000, dtype=np.uint64)]
        source = ListWords(extra, bits)
        got = gs.gaps(np.array(firsts, dtype=np.uint64), source, threshold, cap=10**9)
        # replay: each undecided uniform took its further words from `extra`, in order
        checked = 0
        for first, g in zip(firsts, got.tolist(), strict=True):
            ref = _reference_gap([first], bits, threshold)
            if ref is not None:
                assert g == ref, (first, g, ref)
                checked += 1
        assert checked >= 140
        if margin > gs.FLOAT_MARGIN:
            assert source.used > 0  # the wide margin sent gaps through the exact path


def test_the_exact_path_reads_further_words_and_agrees_with_the_reference():
    """A uniform whose first words are 0 (U < 2⁻¹⁰⁶): only further words fix its gap, found by
    the exact path with exact rational arithmetic as the reference."""
    bits, threshold = 53, gs.rate_threshold(0.5, 53)
    for tail in ([0, 5, 123456789], [0, (1 << 53) - 1, 7], [1, 0, 9]):
        source = ListWords(tail[1:] + [3] * 10, bits)
        got = int(gs.gaps(np.array([tail[0]], dtype=np.uint64), source, threshold, cap=10**6))
        ref = _reference_gap(tail[: 1 + source.used], bits, threshold)
        assert ref is not None and got == ref, (tail, got, ref)


def test_power_bracket_contains_the_exact_power():
    for base, bits, k in [(3, 2, 7), ((1 << 53) - 12345, 53, 1000), ((1 << 64) - 1, 64, 40)]:
        exact = Fraction(base, 1 << bits) ** k
        for precision in (bits, 128, 300, bits * k):
            lo, hi = gs._power_bracket(base, bits, k, precision)
            assert Fraction(lo, 1 << precision) <= exact <= Fraction(hi, 1 << precision)
        lo, hi = gs._power_bracket(base, bits, k, bits * k)
        assert lo == hi == exact * (1 << (bits * k))


def test_float_log_is_within_the_margin_on_this_platform():
    """The fast path's premise: float64 log (torch) and log1p (math) err by far less than the
    1e-12 relative margin (measured against mpmath at 60 digits)."""
    mpmath.mp.dps = 60
    rng = np.random.default_rng(0)
    u = np.concatenate([rng.random(2000), 2.0 ** -rng.uniform(0, 53, 2000)])
    got = torch.log(torch.from_numpy(u)).numpy()
    worst = max(abs(float(g) / float(mpmath.log(mpmath.mpf(float(x)))) - 1) for g, x in zip(got, u))
    for p in (1e-12, 1e-6, 1e-4, 0.01, 0.3, 0.5):
        exact = float(mpmath.log1p(-mpmath.mpf(p)))
        worst = max(worst, abs(math.log1p(-p) / exact - 1))
    assert worst < 1e-15 < gs.FLOAT_MARGIN / 100


def _gap_sample(source, threshold: int, count: int) -> np.ndarray:
    return gs.gaps(source.draw(count), source, threshold, cap=10**9).numpy()


@pytest.mark.parametrize("kind", ["torch", "stream"])
def test_gaps_follow_the_geometric_law(kind):
    """Chi-square of 200,000 gaps against P(G = k) = (1 − p)^k p, p = ⌊q·2^bits⌋/2^bits."""
    q = 0.05
    source = (
        gs.TorchWords(torch.Generator().manual_seed(3))
        if kind == "torch"
        else StreamWords(SecureStream(b"\x07" * 32))
    )
    threshold = gs.rate_threshold(q, source.bits)
    p = threshold / 2**source.bits
    sample = _gap_sample(source, threshold, 200_000)
    edges = list(range(0, 120)) + [10**12]
    observed = np.histogram(sample, bins=edges)[0]
    k = np.arange(120)
    expected = np.append(p * (1 - p) ** k[:-1], (1 - p) ** 119) * len(sample)
    assert stats.chisquare(observed, expected).pvalue > ALPHA


def _counts(batches, n: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    single = np.zeros(n)
    pairs = np.zeros(n - 1)
    sizes = []
    for b in batches:
        mask = np.zeros(n, dtype=bool)
        mask[b.numpy()] = True
        single += mask
        pairs += mask[:-1] & mask[1:]
        sizes.append(int(mask.sum()))
    return single, pairs, sizes


@pytest.mark.parametrize("kind", ["plain", "secure"])
def test_each_example_is_included_at_the_rate_independently(kind):
    """20,000 steps over 40 examples at q = 0.15: every example's count passes a two-sided
    binomial test at the drawn rate (Bonferroni), neighbours are included together at rate p²
    (independence: a skip that leaked between positions would not be), and the batch size
    follows Binomial(40, p)."""
    n, q, steps = 40, 0.15, 20_000
    if kind == "plain":
        sampler = PoissonSampler(n, q, steps, seed=11)
        p = math.floor(q * 2**53) / 2**53
    else:
        sampler = SecurePoissonSampler(n, q, steps, stream=SecureStream(b"\x01" * 32))
        p = math.floor(Fraction(q) * 2**64) / 2**64
    single, pairs, sizes = _counts(sampler, n)
    for c in single:
        assert stats.binomtest(int(c), steps, p).pvalue > ALPHA / n
    for c in pairs:
        assert stats.binomtest(int(c), steps, p * p).pvalue > ALPHA / n
    observed = np.bincount(sizes, minlength=n + 1)
    expected = stats.binom.pmf(np.arange(n + 1), n, p) * steps
    keep = expected >= 5  # pool the sparse tails
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA


def test_rate_is_never_above_q():
    for bits in (53, 64):
        for q in (1024 / 10**7, 1 / 3, 0.05, 1e-9, 2.0**-70, 0.999999, 1.0, 0.0):
            t = gs.rate_threshold(q, bits)
            assert Fraction(t, 1 << bits) <= Fraction(q)
            assert Fraction(q) - Fraction(t, 1 << bits) < Fraction(1, 1 << bits)


def test_edge_rates_and_sizes():
    g = torch.Generator().manual_seed(0)
    assert poisson_indices(7, 1.0, g).tolist() == list(range(7))
    assert poisson_indices(10**6, 2.0**-60, g).numel() == 0  # ⌊q·2⁵³⌋ = 0: nobody
    assert poisson_indices(1, 0.5, g).numel() in (0, 1)
    big = poisson_indices(10**7, 0.5, g)  # batches of millions still work
    assert abs(big.numel() - 5 * 10**6) < 6 * math.sqrt(2.5 * 10**6)
    assert bool((big[1:] > big[:-1]).all()) and int(big[-1]) < 10**7 and int(big[0]) >= 0


def test_union_over_ranks_is_the_single_process_batch():
    """With the shared seed every rank draws the same batch and keeps its part: the parts are
    disjoint and their union is one process's batch, every step (plain, secure, per-user)."""
    n, q, steps, world = 5000, 0.01, 30, 3
    key = b"\x05" * 32

    def plain(ranks):
        s = PoissonSampler(n, q, steps, seed=9)
        s.ranks = ranks
        return list(s)

    def secure(ranks):
        return list(SecurePoissonSampler(n, q, steps, stream=SecureStream(key), ranks=ranks))

    users = UserIndex.of(torch.arange(n) % 700)

    def per_user(ranks):
        s = SecureUserPoissonSampler(users, 0.05, steps, 3, seed=4, stream=SecureStream(key))
        s.ranks = ranks
        return list(s)

    for draw in (plain, secure, per_user):
        whole = draw(Ranks())
        parts = [draw(Ranks(rank=r, world_size=world)) for r in range(world)]
        for t in range(steps):
            joined = torch.cat([p[t] for p in parts])
            assert joined.numel() == torch.unique(joined).numel()  # disjoint
            assert sorted(joined.tolist()) == sorted(whole[t].tolist())


def test_resume_draws_the_batches_that_would_have_followed():
    n, q = 100_000, 0.003
    a = PoissonSampler(n, q, 20, seed=5)
    it = iter(a)
    first = [next(it) for _ in range(7)]
    state = a.state_dict()
    rest = list(it)
    b = PoissonSampler(n, q, 20, seed=123)
    b.load_state_dict(state)
    again = list(b)[:13]
    assert len(first) == 7 and all(torch.equal(x, y) for x, y in zip(rest, again, strict=True))

    s = SecurePoissonSampler(n, q, 20, stream=SecureStream(b"\x02" * 32))
    it2 = iter(s)
    _ = [next(it2) for _ in range(4)]
    saved = s.state_dict()
    tail = list(it2)
    r = SecurePoissonSampler(n, q, 20)
    r.load_state_dict(saved)
    assert all(torch.equal(x, y) for x, y in zip(tail, list(r), strict=True))
