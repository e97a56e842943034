"""A PLD composed with itself T times: dp_accounting's computation, with its truncation bounds
computed in one vectorised pass.

``PrivacyLossDistribution.self_compose`` (dp_accounting) raises the PMF's FFT to the T-th power
on the loss range ``[lo, hi]`` outside which the T-fold sum keeps at most the truncated mass,
and adds that mass to +∞ (pessimistic). It sizes the range with the Chernoff bound over 40
orders λ (``λ·n ∈ {−20, …, −1, 1, …, 20}``, n the PMF's length), each by its own
``scipy.special.logsumexp`` call: about a quarter of a millisecond each, mostly call overhead,
which made these bounds about half of a budget check's accountant time (docs/benchmarks/
budget.md). Here the same 40 log-moment-generating functions are computed together with numpy
(the log-sum-exp's shift is the largest exponent on the PMF's support, as scipy's), and the
rest — the FFT, the infinity mass — is dp_accounting's computation unchanged.

Soundness: the range is the same Chernoff bound,
``P(S ≥ x) ≤ exp(T·log M(λ) − λ·x)`` for λ > 0 (and the mirror for λ < 0), each side at most
half the truncated mass; the log-MGFs are rounded up by a relative 1e-12 before use, so a
rounding difference with scipy's summation order can only widen the range (more mass kept,
never less). The truncated mass is added to +∞ whether or not any was truncated, exactly as
dp_accounting does. ``tests/dprc_core/accounting/test_pld_self_compose.py`` compares the result
with dp_accounting's on random and real PMFs.

:func:`compose` is ``PrivacyLossDistribution.compose`` likewise: dp_accounting convolves the two
PMFs and then finds the prefix and the suffix to truncate with a Python loop over the
convolution, one element at a time until their sums exceed half the truncation (milliseconds
on the long composed PMFs of a data set's history; a third of a budget check's block
compositions). Here the same prefixes come from one ``numpy.cumsum`` (the same sequential
float64 additions, so the same indices), and the rest is dp_accounting's computation: the
composed PLD is identical.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import fft, signal

from dprc_core.accounting.memory import note_transform

_ORDERS_TIMES_N = np.concatenate((np.arange(-20, 0), np.arange(1, 21))).astype(np.float64)
_ROUND_UP = 1e-12  # relative widening of each log-MGF against summation-order round-off
_CHUNK_CELLS = 1 << 22  # orders × PMF cells evaluated at once (32 MiB of doubles)


def _log_mgfs(probs: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """log Σ_i p_i e^{λ i} for each λ in ``orders`` (−inf for a PMF without mass)."""
    support = np.nonzero(probs > 0)[0]
    out = np.full(orders.shape, -np.inf)
    if support.size == 0:
        return out
    idx = support.astype(np.float64)
    log_p = np.log(probs[support])
    per_chunk = max(1, _CHUNK_CELLS // support.size)
    for start in range(0, orders.size, per_chunk):
        lam = orders[start : start + per_chunk]
        expo = np.multiply.outer(lam, idx)
        expo += log_p
        top = expo.max(axis=1)
        expo -= top[:, None]
        np.exp(expo, out=expo)
        out[start : start + per_chunk] = top + np.log(expo.sum(axis=1))
    return out


def chernoff_log_mgfs(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The orders λ of the Chernoff bound of :func:`self_convolve_bounds` for ``probs`` and
    its log-MGFs at them (rounded up): what the bounds of every ``times`` share, computed once
    (:mod:`dprc_core.accounting.step_epsilons` keeps them across a run's steps)."""
    orders = _ORDERS_TIMES_N / len(probs)
    log_mgfs = _log_mgfs(np.asarray(probs, dtype=np.float64), orders)
    return orders, log_mgfs + _ROUND_UP * np.abs(log_mgfs)


def self_convolve_bounds(
    probs: np.ndarray,
    times: int,
    truncation: float,
    log_mgfs: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[int, int]:
    """[lo, hi] (offsets in cells) outside which the ``times``-fold self-convolution of
    ``probs`` has at most ``truncation`` mass: dp_accounting's Chernoff bound
    (``common.compute_self_convolve_bounds``), vectorised. ``log_mgfs``: what
    :func:`chernoff_log_mgfs` returns for ``probs``, when already computed."""
    upper = (len(probs) - 1) * times
    lower = 0
    if truncation == 0:
        return lower, upper
    orders, log_mgfs_up = chernoff_log_mgfs(probs) if log_mgfs is None else log_mgfs
    with np.errstate(over="ignore", invalid="ignore"):
        bounds = (times * log_mgfs_up + math.log(2 / truncation)) / orders
    for order, bound in zip(orders, bounds, strict=True):
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


def self_compose_dense(
    pmf: pld_pmf.DensePLDPmf,
    times: int,
    truncation: float,
    log_mgfs: tuple[np.ndarray, np.ndarray] | None = None,
) -> pld_pmf.DensePLDPmf:
    """The ``times``-fold self-composition of a dense PMF (``log_mgfs``: its
    :func:`chernoff_log_mgfs`, when already computed)."""
    # pylint: disable=protected-access
    probs = pmf._probs
    lo, hi = self_convolve_bounds(probs, times, truncation, log_mgfs)
    length = hi - lo + 1
    fast = fft.next_fast_len(max(length, len(probs)))
    note_transform(fast)
    wrapped = np.real(fft.ifft(fft.fft(probs, fast) ** times))
    out = np.array(np.roll(wrapped, -lo)[:length])
    inf_mass = truncation - math.expm1(times * math.log1p(-pmf._infinity_mass))
    return pld_pmf.DensePLDPmf(
        pmf._discretization,
        pmf._lower_loss * times + lo,
        out,
        inf_mass,
        pmf._pessimistic_estimate,
    )


def _self_compose_pmf(pmf: pld_pmf.PLDPmf, times: int, truncation: float) -> pld_pmf.PLDPmf:
    if isinstance(pmf, pld_pmf.DensePLDPmf):
        return self_compose_dense(pmf, times, truncation)
    if isinstance(pmf, pld_pmf.SparsePLDPmf) and times > 1:
        if pmf.size**times <= pld_pmf._MAX_PMF_SPARSE_SIZE:  # pylint: disable=protected-access
            return pmf.self_compose(times, truncation)  # stays sparse: dp_accounting's own
        return self_compose_dense(pmf.to_dense_pmf(), times, truncation)
    return pmf.self_compose(times, truncation)


def self_compose(
    pld: PrivacyLossDistribution, times: int, truncation: float
) -> PrivacyLossDistribution:
    """``pld.self_compose(times, tail_mass_truncation=truncation)``, the same result with the
    truncation bounds computed in one pass (see the module docstring)."""
    if times < 1:
        raise ValueError(f"times should be >= 1, got {times}")
    # pylint: disable=protected-access
    remove = _self_compose_pmf(pld._pmf_remove, times, truncation)
    if pld._symmetric:
        return PrivacyLossDistribution(remove)
    return PrivacyLossDistribution(remove, _self_compose_pmf(pld._pmf_add, times, truncation))


_FIRST_CHUNK = 1024  # elements of the first stretch searched (tails are usually short)


def _prefix_to_truncate(arr: np.ndarray, threshold: float) -> int:
    """The largest prefix of ``arr`` whose sum is at most ``threshold``: the first index where
    the running sum exceeds it (dp_accounting's loop adds the same float64s in the same
    order as ``cumsum``), or the length when none does.

    The running sum is computed in stretches of doubling length, each started from the sum so
    far (``cumsum`` of [sum so far, next elements...]: the same sequential additions, so the
    same float64s as one ``cumsum`` of the whole array), and the search stops at the first
    stretch where it exceeds the threshold: a truncated tail is usually a few hundred
    elements of a PMF of 10⁵–10⁶."""
    n = len(arr)
    total = 0.0
    start, size = 0, _FIRST_CHUNK
    while start < n:
        stop = min(start + size, n)
        run = np.cumsum(np.concatenate(([total], arr[start:stop])))[1:]
        above = run > threshold
        i = int(np.argmax(above))
        if above[i]:
            return start + i
        total = float(run[-1])
        start, size = stop, 2 * size
    return n


def _truncate_tails(
    probs: np.ndarray, truncation: float, pessimistic: bool
) -> tuple[int, np.ndarray, float]:
    """dp_accounting's ``pld_pmf._truncate_tails`` with the prefixes found by
    :func:`_prefix_to_truncate`: each tail of mass at most ``truncation``/2 is cut, the left
    one added to the first element kept and the right one sent to +∞ (pessimistic)."""
    if truncation == 0:
        return 0, probs, 0.0
    left = _prefix_to_truncate(probs, truncation / 2)
    right = len(probs) - _prefix_to_truncate(np.flip(probs), truncation / 2)
    right = max(right, left + 1)
    left_mass = np.sum(probs[:left])
    right_mass = np.sum(probs[right:])
    # a copy, not a view: a cached PLD would otherwise keep the whole convolution alive (the
    # truncated tails included: often most of it), unseen by the cache's byte count
    kept = probs[left:right].copy()
    if pessimistic:
        kept[0] += left_mass
        return left, kept, float(right_mass)
    kept[-1] += right_mass
    return left, kept, 0.0


def _compose_pmfs(a: pld_pmf.PLDPmf, b: pld_pmf.PLDPmf, truncation: float) -> pld_pmf.PLDPmf:
    # pylint: disable=protected-access
    if (
        isinstance(a, pld_pmf.SparsePLDPmf)
        and isinstance(b, pld_pmf.SparsePLDPmf)
        and a.size * b.size <= pld_pmf._MAX_PMF_SPARSE_SIZE
    ):
        return a.compose(b, truncation)  # stays sparse: dp_accounting's own
    da, db = a.to_dense_pmf(), b.to_dense_pmf()
    da.validate_composable(db)
    note_transform(len(da._probs) + len(db._probs) - 1)
    probs = signal.fftconvolve(da._probs, db._probs)
    inf_mass = da._infinity_mass + db._infinity_mass - da._infinity_mass * db._infinity_mass
    offset, probs, right_tail = _truncate_tails(probs, truncation, da._pessimistic_estimate)
    return pld_pmf.DensePLDPmf(
        da._discretization,
        da._lower_loss + db._lower_loss + offset,
        probs,
        inf_mass + right_tail,
        da._pessimistic_estimate,
    )


def compose(
    first: PrivacyLossDistribution, second: PrivacyLossDistribution, truncation: float
) -> PrivacyLossDistribution:
    """``first.compose(second, tail_mass_truncation=truncation)``, the same result with the
    truncated tails found in one pass (see the module docstring)."""
    # pylint: disable=protected-access
    remove = _compose_pmfs(first._pmf_remove, second._pmf_remove, truncation)
    if first._symmetric and second._symmetric:
        return PrivacyLossDistribution(remove)
    add = _compose_pmfs(first._pmf_add, second._pmf_add, truncation)
    return PrivacyLossDistribution(remove, add)


__all__ = [
    "chernoff_log_mgfs",
    "compose",
    "self_compose",
    "self_compose_dense",
    "self_convolve_bounds",
]
