"""Per-step privacy-loss distribution of the Poisson-subsampled Gaussian with a random scale.

Mechanism (one step, docs/design.md §4): the adversary sees the scale ``a`` (pessimistic), and given
``a`` the step is a Poisson-subsampled Gaussian with sensitivity ``a`` (units of C) and noise
σ. Its privacy profile in either direction is therefore the mixture
``δ_mix(ε) = Σ_j w_j δ(ε; a_j/σ) + w_∞ δ_∞(ε)`` of the profiles of a dominating discrete scale
(:mod:`scale_distribution`). The deterministic scale a = 1 is plain DP-SGD.

Discretisation ("connect the dots", Doroshenko et al. 2022, as in ``dp_accounting``): on
support points ε_1 < … < ε_n of the grid h·ℤ the discrete PLD is chosen with the **same**
profile at every ε_i and, between them, the chord in the e^ε variable; below ε_1 it is the
chord from (e^ε = 0, δ = 1). A privacy profile is convex and non-increasing in e^ε, so the
discrete profile lies above the true one everywhere; the mass above ε_n is δ_mix(ε_n) and is
put at +∞. Hence the discrete pair dominates the mechanism in each direction, for every ε, and
so do their compositions. Any subset of grid points is allowed, which lets the far tails use
coarser gaps than the bulk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.hockey_stick import (
    DIRECTIONS,
    Direction,
    delta_infinite_sensitivity,
    delta_subsampled,
    loss_bounds,
    lower_tail,
    lower_tail_infinite_sensitivity,
)
from dprc_core.accounting.scale_distribution import ScaleDistribution

_CHUNK = 4096  # support points per vectorised block (bounds memory to ~bins × 4096 doubles)
_BULK_TAIL = 1e-3  # below/above these per-step loss quantiles the support gets coarser
_GAP_GROWTH = 0.02  # outside the bulk, gaps grow geometrically by this factor


@dataclass(frozen=True)
class StepMechanism:
    """One step: noise multiplier σ, sampling rate q, scale distribution of the sensitivity."""

    sigma: float
    q: float
    scale: ScaleDistribution


def mixture_delta(
    eps: np.ndarray, mech: StepMechanism, direction: Direction, include_infinite: bool = True
) -> np.ndarray:
    """δ_mix(ε) of the step in one direction (an upper bound on the true profile).

    ``include_infinite=False`` leaves out the part of the infinite scale (used to size the
    loss range: that part is a constant q·w_∞ above log(1 − q) and ends up at +∞ anyway)."""
    eps = np.asarray(eps, dtype=np.float64)
    s = mech.scale.values / mech.sigma
    out = np.empty(eps.shape)
    for start in range(0, eps.size, _CHUNK):
        e = eps[start : start + _CHUNK]
        block = mech.scale.weights @ delta_subsampled(e, s, mech.q, direction)
        if include_infinite and mech.scale.inf_weight > 0:
            block = block + mech.scale.inf_weight * delta_infinite_sensitivity(e, mech.q, direction)
        out[start : start + _CHUNK] = block
    return np.clip(out, 0.0, 1.0)


def mixture_lower_tail(t: np.ndarray, mech: StepMechanism, direction: Direction) -> np.ndarray:
    """P(L < t) of the step's privacy loss in one direction."""
    t = np.asarray(t, dtype=np.float64)
    s = mech.scale.values / mech.sigma
    val = mech.scale.weights @ lower_tail(t, s, mech.q, direction)
    if mech.scale.inf_weight > 0:
        val = val + mech.scale.inf_weight * lower_tail_infinite_sensitivity(t, mech.q, direction)
    return val


_TREE_DEPTH = 8  # bisection levels evaluated together (255 points a call)


def _bisection_tree(lo: float, hi: float, levels: int) -> np.ndarray:
    """The midpoints of the next ``levels`` levels of a bisection of [lo, hi], in heap order
    (node i's children are 2i + 1 and 2i + 2), each computed from its interval's ends as
    ``0.5 * (a + b)``, exactly as the sequential loop computes it."""
    a, b = np.array([lo]), np.array([hi])
    out = []
    for _ in range(levels):
        mid = 0.5 * (a + b)
        out.append(mid)
        a2 = np.empty(2 * mid.size)  # children: (a, mid) then (mid, b)
        b2 = np.empty(2 * mid.size)
        a2[0::2], a2[1::2] = a, mid
        b2[0::2], b2[1::2] = mid, b
        a, b = a2, b2
    return np.concatenate(out)


def bisect(
    fn: Callable[[np.ndarray], np.ndarray],
    lo: float,
    hi: float,
    iters: int = 60,
    rel_tol: float | None = 1e-12,
) -> tuple[float, float]:
    """Bisection of a monotone, vectorised ``fn`` (false at ``lo``, true at ``hi``): up to
    ``iters`` halvings ``mid = (lo + hi)/2`` (hi ← mid where fn is true, else lo ← mid),
    stopping once hi − lo ≤ rel_tol·max(1, |hi|) (never, for ``rel_tol=None``); returns the
    final (lo, hi).

    The same midpoints as a one-at-a-time bisection, hence the same answer, with eight levels
    evaluated in one call: the 255 midpoints of the next eight levels of the bisection tree
    (:func:`_bisection_tree`) go to ``fn`` together, and the descent then reads the decisions
    it needs (the 40 to 60 halvings of a loss range in 5 to 8 calls instead of 40 to 60)."""
    done = 0
    while done < iters:
        levels = min(_TREE_DEPTH, iters - done)
        mids = _bisection_tree(lo, hi, levels)
        truth = np.asarray(fn(mids), dtype=bool)
        node = 0
        for _ in range(levels):
            if truth[node]:
                hi, node = float(mids[node]), 2 * node + 1
            else:
                lo, node = float(mids[node]), 2 * node + 2
            done += 1
            if rel_tol is not None and hi - lo <= rel_tol * max(1.0, abs(hi)):
                return lo, hi
    return lo, hi


def loss_range(mech: StepMechanism, direction: Direction, tail: float) -> tuple[float, float]:
    """[lo, hi] with δ_mix(hi) ≤ tail (mass above hi goes to +∞) and P(L < lo) ≤ tail (mass
    below lo is represented at the lowest support point, i.e. rounded up). Only accuracy
    depends on them: any range gives a pessimistic PLD."""
    hard_lo, hard_hi = loss_bounds(mech.q, direction)
    probe = np.concatenate([-np.logspace(4, -9, 140), [0.0], np.logspace(-9, 4, 140)])

    def small(x: np.ndarray) -> np.ndarray:
        return mixture_delta(x, mech, direction, include_infinite=False) <= tail

    def heavy(x: np.ndarray) -> np.ndarray:
        return mixture_lower_tail(x, mech, direction) > tail

    if math.isfinite(hard_hi):
        hi = hard_hi
    else:
        d = mixture_delta(probe, mech, direction, include_infinite=False)
        idx = int(np.argmax(d <= tail))
        if d[idx] > tail:
            raise ValueError("privacy loss tail does not vanish below 1e4; parameters too extreme")
        hi = bisect(small, float(probe[max(idx - 1, 0)]), float(probe[idx]))[1]
    lt = mixture_lower_tail(probe, mech, direction)
    above = np.nonzero(lt > tail)[0]
    first = int(above[0]) if above.size else probe.size - 1
    # largest x with P(L < x) ≤ tail lies in [probe[first-1], probe[first]]
    a = float(probe[max(first - 1, 0)])
    if first > 0:
        a = bisect(heavy, a, float(probe[first]), rel_tol=None)[0]
    lo = max(a, hard_lo) if math.isfinite(hard_lo) else a
    lo = min(lo, hi)
    return lo, hi


def _support_indices(i_lo: int, i_hi: int, bulk_lo: int, bulk_hi: int) -> np.ndarray:
    """Grid indices: every point in [bulk_lo, bulk_hi], geometrically growing gaps outside."""
    bulk_lo, bulk_hi = max(bulk_lo, i_lo), min(bulk_hi, i_hi)
    pts = [np.arange(bulk_lo, bulk_hi + 1)]
    for sign, end in ((1, i_hi), (-1, i_lo)):
        cur, gap, extra = (bulk_hi if sign > 0 else bulk_lo), 1.0, []
        while (cur < end) if sign > 0 else (cur > end):
            gap *= 1.0 + _GAP_GROWTH
            cur = cur + sign * max(1, int(gap))
            cur = min(cur, end) if sign > 0 else max(cur, end)
            extra.append(cur)
        pts.append(np.array(extra, dtype=np.int64))
    return np.unique(np.concatenate(pts).astype(np.int64))


def connect_dots_probabilities(eps: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, float]:
    """Masses on the support ``eps`` and at +∞ whose profile interpolates ``deltas``.

    Mass at ε_i: ``(δ_{i-1} − δ_i)/(1 − e^{ε_{i-1} − ε_i})
    − (δ_i − δ_{i+1})/(e^{ε_{i+1} − ε_i} − 1)`` with δ_0 = 1 and the chord from e^ε = 0 below
    ε_1; mass at +∞ is δ_n.
    """
    # Make the profile non-increasing by raising values (never lowering them).
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    gaps = np.diff(eps)
    if not bool(np.all(gaps > 0)):
        raise ValueError("connect-the-dots support must be strictly increasing")
    diffs = -np.diff(deltas)  # δ_i − δ_{i+1} ≥ 0
    from_left = np.concatenate([[1.0 - deltas[0]], diffs / -np.expm1(-gaps)])
    from_right = np.concatenate([diffs / np.expm1(gaps), [0.0]])
    probs = np.maximum(from_left - from_right, 0.0)
    return probs, float(deltas[-1])


Profile = Callable[[np.ndarray, StepMechanism, Direction], np.ndarray]
"""A per-step privacy profile δ(ε) in one direction (e.g. :func:`mixture_delta`)."""
LossRange = Callable[[StepMechanism, Direction, float], tuple[float, float]]


def step_pmf(
    mech: StepMechanism,
    direction: Direction,
    h: float,
    tail: float,
    loss_lims: tuple[float, float] | None = None,
    bulk: tuple[float, float] | None = None,
    profile: Profile | None = None,
) -> pld_pmf.DensePLDPmf:
    """Pessimistic per-step PMF on the grid h·ℤ for one direction (of ``profile``, default
    the revealed-scale mixture)."""
    profile = profile or mixture_delta
    lo, hi = loss_lims if loss_lims is not None else loss_range(mech, direction, tail)
    i_lo, i_hi = math.floor(lo / h), math.ceil(hi / h)
    if bulk is None:
        idx = np.arange(i_lo, i_hi + 1, dtype=np.int64)
    else:
        idx = _support_indices(i_lo, i_hi, math.floor(bulk[0] / h), math.ceil(bulk[1] / h))
    eps = idx * h
    deltas = profile(eps, mech, direction)
    probs, inf_mass = connect_dots_probabilities(eps, deltas)
    dense = np.zeros(i_hi - i_lo + 1)
    dense[idx - i_lo] = probs
    return pld_pmf.DensePLDPmf(h, i_lo, dense, inf_mass, pessimistic_estimate=True)


def bulk_interval(
    mech: StepMechanism,
    direction: Direction,
    lims: tuple[float, float],
    n_probe: int = 2048,
    profile: Profile | None = None,
) -> tuple[float, float, float, float]:
    """(bulk_lo, bulk_hi, mean, std): loss quantiles at _BULK_TAIL / 1 − _BULK_TAIL, mean and
    std of the per-step loss, from a coarse connect-the-dots PMF on ``n_probe`` points."""
    lo, hi = lims
    if hi <= lo:
        return lo, hi, lo, 0.0
    eps = np.unique(np.linspace(lo, hi, n_probe))  # a range of a few ulps has repeated points
    if eps.size < 2:
        return lo, hi, lo, 0.0
    probs, _ = connect_dots_probabilities(eps, (profile or mixture_delta)(eps, mech, direction))
    total = probs.sum()
    if total <= 0:
        return lo, hi, lo, 0.0
    p = probs / total
    cdf = np.cumsum(p)
    b_lo = eps[max(int(np.searchsorted(cdf, _BULK_TAIL)) - 1, 0)]
    b_hi = eps[min(int(np.searchsorted(cdf, 1.0 - _BULK_TAIL)) + 1, eps.size - 1)]
    mean = float(np.dot(p, eps))
    std = float(np.sqrt(max(np.dot(p, (eps - mean) ** 2), 0.0)))
    return float(b_lo), float(b_hi), mean, std


@dataclass(frozen=True)
class StepGeometry:
    """Loss ranges, bulk intervals, mean and std of the per-step loss, both directions."""

    lims: dict[str, tuple[float, float]]
    bulk: dict[str, tuple[float, float]]
    mean: dict[str, float]
    std: dict[str, float]


def step_geometry(
    mech: StepMechanism,
    tail: float,
    profile: Profile | None = None,
    loss_range_of: LossRange | None = None,
) -> StepGeometry:
    """Geometry of the per-step PLD (of ``profile`` with its ``loss_range_of``; default the
    revealed-scale mixture). ``mech`` may use a coarser (still dominating) scale than the one
    the PLD is built with: only the accuracy, never the soundness, depends on it."""
    ranges = loss_range_of or loss_range
    lims: dict[str, tuple[float, float]] = {}
    bulk: dict[str, tuple[float, float]] = {}
    mean: dict[str, float] = {}
    std: dict[str, float] = {}
    for direction in DIRECTIONS:
        lims[direction] = ranges(mech, direction, tail)
        b_lo, b_hi, mu, sd = bulk_interval(mech, direction, lims[direction], profile=profile)
        bulk[direction] = (b_lo, b_hi)
        mean[direction] = mu
        std[direction] = sd
    return StepGeometry(lims, bulk, mean, std)


def step_pld(
    mech: StepMechanism,
    h: float,
    tail: float,
    geometry: StepGeometry | None = None,
    sparse: bool = True,
    profile: Profile | None = None,
) -> PrivacyLossDistribution:
    """Pessimistic per-step PLD (both adjacency directions) on the grid h·ℤ; give the
    ``geometry`` of ``profile`` when ``profile`` is not the default mixture."""
    geometry = geometry if geometry is not None else step_geometry(mech, tail, profile)
    pmfs = {
        d: step_pmf(
            mech, d, h, tail, geometry.lims[d], geometry.bulk[d] if sparse else None, profile
        )
        for d in DIRECTIONS
    }
    return PrivacyLossDistribution(pmfs["remove"], pmfs["add"])
