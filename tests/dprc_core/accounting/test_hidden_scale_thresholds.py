"""The root brackets of the hidden-scale profile (``hidden_scale_pld._thresholds``): one
evaluation of h and h' and a curvature bound give a bracket, a table of h gives the start
points, and the bracket is widened so that it contains every bracket the former iteration
could return.

References, independent of the module's arithmetic: h at the bracket's ends evaluated with
mpmath at 40 digits, h'' as the variance of the tilted law computed directly, and the former
iteration (Newton from a coarse law until a step below a relative 1e-10, then
[z_n − (h(z_n) − target)/s_min, z_n]), written out here as it was.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from scipy import special

from dprc_core.accounting import hidden_scale_pld
from dprc_core.accounting.hidden_scale_pld import (
    _TABLE_MIN_POINTS,
    _Law,
    _thresholds,
    hidden_delta,
)
from dprc_core.accounting.random_scale_pld import StepMechanism, bisect
from dprc_core.accounting.scale_distribution import envelope_scale, exact_scale

LAWS = [(0.3, 32), (0.78, 32), (2.0, 4), (10.0, 128), (100.0, 2), (1.0, 2)]


def _law(sigma: float, k: int, inf_budget: float = 1e-9) -> _Law:
    scale = envelope_scale(k, None, inf_budget, a_cap=40 * sigma)
    return _Law.of(StepMechanism(sigma, 0.05, scale))


def _mp_h(law: _Law):
    """h(z) = log Σ_j w_j exp(s_j z − s_j²/2) at 40 digits, from the atoms."""
    mpmath.mp.dps = 40
    s = [mpmath.mpf(float(x)) for x in law.s]
    lw = [mpmath.mpf(float(x)) for x in law.log_w]

    def h(z: float) -> mpmath.mpf:
        zz = mpmath.mpf(float(z))
        terms = (mpmath.exp(a + si * zz - si * si / 2) for a, si in zip(lw, s, strict=True))
        return mpmath.log(mpmath.fsum(terms))

    return h


@pytest.mark.parametrize(("sigma", "k"), LAWS)
def test_brackets_contain_the_root(sigma, k):
    """h is increasing, so h(t_lo) ≤ target ≤ h(t_hi) at 40 digits puts the root inside."""
    law = _law(sigma, k)
    h = _mp_h(law)
    rng = np.random.default_rng(int(sigma * 100) + k)
    many = np.sort(rng.uniform(-25.0, 25.0, 2 * _TABLE_MIN_POINTS))  # the table's path
    few = rng.uniform(-25.0, 25.0, 4)  # the path without a table
    for targets, step in ((many, 128), (few, 1)):
        lo, hi = _thresholds(targets, law)
        for i in range(0, targets.size, step):
            assert h(lo[i]) <= targets[i] <= h(hi[i])
            # tight: the widening of _thresholds (1e-10 relative times h'/s_min) and little more
            assert hi[i] - lo[i] <= 3e-10 * (1 + abs(hi[i])) * law.s[-1] / law.s[0]


@pytest.mark.parametrize(("sigma", "k"), LAWS)
def test_curvature_bounds_the_second_derivative(sigma, k):
    """h''(z) is the variance of s under the tilted law: never above (s_max − s_min)²/4."""
    law = _law(sigma, k)
    for z in np.linspace(-30.0, 30.0, 121):
        logits = law.log_w + law.s * z - 0.5 * law.s**2
        p = np.exp(logits - special.logsumexp(logits))
        mean = p @ law.s
        assert p @ (law.s - mean) ** 2 <= law.curvature * (1 + 1e-12)


def _former_bracket(target: np.ndarray, law: _Law) -> tuple[np.ndarray, np.ndarray]:
    """The former iteration: start below the smallest tangent root of a coarse law, Newton on
    that law, then Newton on the fine h (at least two steps) until a step is below a relative
    1e-10; the bracket of its last evaluated iterate z_n."""

    def h_and_slope(z, s, log_w):
        expo = np.multiply.outer(s, z) + (log_w - 0.5 * s * s)[:, None]
        top = expo.max(axis=0)
        e = np.exp(expo - top)
        return top + np.log(e.sum(axis=0)), (s @ e) / e.sum(axis=0)

    def newton(z, s, log_w, min_steps):
        z = z.copy()
        z_last, h_last = np.empty(z.shape), np.empty(z.shape)
        active = np.ones(z.shape, dtype=bool)
        for it in range(200):
            idx = np.nonzero(active)[0]
            if idx.size == 0:
                return z_last, h_last
            h, g = h_and_slope(z[idx], s, log_w)
            z_last[idx], h_last[idx] = z[idx], h
            step = (h - target[idx]) / g
            z[idx] = z[idx] - step
            if it + 1 >= min_steps:
                active[idx] = np.abs(step) > 1e-10 * (1.0 + np.abs(z[idx]))
        raise AssertionError("no convergence")

    group = max(1, law.s.size // 192)
    starts = np.arange(0, law.s.size, group)
    ends = np.minimum(starts + group, law.s.size) - 1
    cs, cw = law.s[ends], np.log(np.add.reduceat(np.exp(law.log_w), starts))
    z0 = np.min((target[None, :] - cw[:, None]) / cs[:, None] + 0.5 * cs[:, None], axis=0)
    if group > 1:
        z0, _ = newton(z0, cs, cw, 1)
    z, h = newton(z0, law.s, law.log_w, 2)
    margin = 1e-12 * (1.0 + np.abs(z))
    return z - np.maximum(h - target, 0.0) / law.s[0] - margin, z + margin


@pytest.mark.parametrize(("sigma", "k"), LAWS)
def test_brackets_contain_the_former_ones(sigma, k):
    law = _law(sigma, k)
    for n in (2 * _TABLE_MIN_POINTS, 40):  # with and without the start table
        targets = np.sort(np.random.default_rng(k + n).uniform(-25.0, 25.0, n))
        lo, hi = _thresholds(targets, law)
        old_lo, old_hi = _former_bracket(targets, law)
        assert np.all(lo <= old_lo) and np.all(hi >= old_hi)


@pytest.mark.parametrize(("sigma", "k"), [(0.78, 32), (2.0, 4), (10.0, 128)])
@pytest.mark.parametrize("q", [0.001, 0.05, 1.0])
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_profile_is_at_least_the_former_one(sigma, k, q, direction, monkeypatch):
    """Widening the bracket can only raise δ (the wider bracket is the pessimistic one): the
    profile with the brackets of _thresholds is at least the one with the former brackets
    (up to the round-off of its own sums)."""
    scale = envelope_scale(k, None, 1e-9 / (4 * q), a_cap=40 * sigma)
    mech = StepMechanism(sigma, q, scale)
    eps = np.concatenate([-np.logspace(1.5, -5, 400), [0.0], np.logspace(-5, 1.5, 400)])
    ours = hidden_delta(eps, mech, direction)
    monkeypatch.setattr(hidden_scale_pld, "_thresholds", _former_bracket)
    former = hidden_delta(eps, mech, direction)
    assert np.all(ours >= former - 1e-15 * np.maximum(former, 1e-300) - 1e-300)


def test_single_atom_law_is_exact():
    """One atom: h is affine, the root is closed-form and the bracket holds it."""
    law = _Law.of(StepMechanism(1.3, 0.1, exact_scale()))
    targets = np.linspace(-20.0, 20.0, 101)
    lo, hi = _thresholds(targets, law)
    s = 1.0 / 1.3
    root = (targets + 0.5 * s * s) / s
    assert np.all(lo <= root) and np.all(root <= hi)


def _sequential_bisect(fn, lo, hi, iters=60, rel_tol=1e-12):
    """The one-point-at-a-time bisection the loss ranges used before."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if fn(np.array([mid]))[0]:
            hi = mid
        else:
            lo = mid
        if rel_tol is not None and hi - lo <= rel_tol * max(1.0, abs(hi)):
            break
    return lo, hi


@pytest.mark.parametrize("point", [-1234.5678, -1e-7, 0.0, 3.25, 9876.5])
@pytest.mark.parametrize("rel_tol", [1e-12, None])
def test_batched_bisection_is_the_sequential_one(point, rel_tol):
    """Six levels of the bisection tree a call, the same midpoints and the same answer."""

    def fn(x, p=point):
        return np.asarray(x) >= p

    for lo, hi in ((point - 100.0, point + 57.0), (point - 3.0, point + 1e-3)):
        ours = bisect(fn, lo, hi, rel_tol=rel_tol)
        assert ours == _sequential_bisect(fn, lo, hi, rel_tol=rel_tol)
        assert not fn(ours[0]) and fn(ours[1])
