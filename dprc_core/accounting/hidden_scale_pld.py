"""Per-step PLD of randomized clipping with per-example sketches: the hidden-scale mechanism.

With an independent projection per example (docs/accounting.md §10) the target's clipped
contribution is ``a·C·u`` with ``u`` fixed and the scale ``a`` independent of everything else in
the released sum, and one step reduces to the one-dimensional pair (noise std σ, units of C)

* ``P0 = N(0, σ²)``  against  ``P1 = (1 − q)·N(0, σ²) + q·E_a N(a, σ²)``,

*remove*: (P1, P0), *add*: (P0, P1) — a single mixture, unlike the revealed-scale model of
:mod:`random_scale_pld` where the profile is the mixture over a of profiles. ``a`` is the same
dominating discrete law the accountant uses for the envelope
(:mod:`scale_distribution`: atoms ``a_j`` with weights ``w_j``, scales rounded up in bins, and a
mass ``w_∞`` at ``a = +∞``, an atom of P1 at x = +∞ where P0 has none).

In units of σ (z = x/σ, s_j = a_j/σ) the likelihood ratio is
``LR(z) = (1 − q) + q·exp(h(z))`` with ``h(z) = log Σ_j w_j exp(s_j z − s_j²/2)``: a log-sum-exp
of increasing affine functions, so h is convex and increasing with slope in [s_min, s_max].
LR is increasing, the optimal tests are half-lines, and for every ε

* remove (ε > log(1 − q)): ``δ(ε) = P1(z > t) − e^ε P0(z > t)``,
  ``h(t) = log((e^ε − 1 + q)/q)``;
* add (ε < −log(1 − q)): ``δ(ε) = P0(z < t) − e^ε P1(z < t)``,
  ``h(t) = log((e^{−ε} − 1 + q)/q)``;

and δ = 1 − e^ε (remove) / 0 (add) outside those ranges. t is bracketed from evaluations of h
and h' (:func:`_bracket`): at any point z, with e = (target − h(z))/h'(z), convexity puts the
root at or below z + e, and the curvature bound h'' ≤ V = (s_max − s_min)²/4 (h'' is the
variance of s under the tilted law) with h' ≥ s_min puts it at or above a point about V·e²/(2h')
below that. Start points come from a cubic Hermite table of h (one evaluation per threshold is
then enough), Newton steps tighten any bracket wider than a relative 1e-10, and the bracket is
widened to contain every bracket the former iteration (Newton to a step below 1e-10, then
``[t_n − (h(t_n) − target)/s_min, t_n]``) could return, plus a relative 1e-12 and an h's
round-off. δ is evaluated at the ends of that bracket in the direction that can only raise it
(``P1(z > t) ≤ P1(z > t_lo)``, ``P0(z > t) ≥ P0(z > t_hi)``, ...). So the profile computed here
is an upper bound on the profile of the discrete law, and the connect-the-dots PMF built from it
(:func:`random_scale_pld.connect_dots_probabilities`, the same construction and argument as the
revealed-scale PLD) dominates the mechanism in each direction, for every ε.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import special

from dprc_core.accounting.hockey_stick import (
    Direction,
    log1p_expm1_over,
    loss_bounds,
)
from dprc_core.accounting.random_scale_pld import (
    StepGeometry,
    StepMechanism,
    bisect,
    step_geometry,
    step_pld,
    step_pmf,
)

_CHUNK = 512  # thresholds per vectorised block (bounds memory to ~bins × 512 doubles)
_NEWTON_MAX = 200  # Newton iterations per threshold at most (typically 1–2 from the table)
_NEWTON_TOL = 1e-10  # relative width of the root bracket at which the iteration stops
_BRACKET_MARGIN = 1e-12  # relative widening of the root bracket against round-off
_H_ROUNDING = 1e-15  # relative error allowed for a computed h(z) (a few ulps of a log-sum-exp)
_TABLE_MIN_POINTS = 512  # fewer thresholds than this are solved without a start table
_TABLE_SPACING = 0.25  # table nodes ≤ this / (s_max − s_min) apart (start points to ~1e-6)
_TABLE_MAX_NODES = 2048
_WIDEN = 1.0 + 1e-6  # rounds the former iteration's widest bracket up (see _thresholds)
# Halvings of a loss range's end (hidden_loss_range) after the probe: one call of the
# bisection (255 points). The probes are 1.24× apart, so the end is found to about 0.1 % of
# itself, on the safe side (δ(hi) ≤ tail, P(L < lo) ≤ tail): the range is at most that much
# wider, a few support points more. The ends only size the PMF; any range is sound. Events on
# the legacy 0.1 % law keep the legacy ends (bisected to 1e-12, ``precise=True``), so that their
# ε is the one they were planned and charged with, to the last digit.
_RANGE_HALVINGS = 8

ProfileFn = Callable[[np.ndarray, Direction], np.ndarray]

# Threads that evaluate the blocks of the mixtures (ndtr and exp release the GIL). The blocks
# are the same _CHUNK-point blocks as a one-thread loop computes, each by the same operations,
# so every value is the same to the bit (tests/dprc_core/accounting/test_hidden_scale_threads.py).
# DPRC_ACCOUNTANT_THREADS=1 computes them in the calling thread. Only laws of at least
# _THREAD_MIN_ATOMS atoms go to the pool: a block of the current 1 % law (~20 atoms coarse,
# ~90 fine) is 0.1–0.5 ms of work, about what handing it to another thread and back costs, and
# the burst's accountant work took 1.15 s of CPU in one thread against 1.38–1.41 s on two, in
# wall time as well (benchmarks/hutch_creates.py, idle machine); a block of the legacy 0.1 %
# law's hundreds of atoms gains 1.5–1.8x in wall time from a second core (a /tmp timing of
# _phi_bar_mix + _h_and_slope on 4,096 points: 1.41x at 128 atoms, 1.56x at 256, 1.82x at 1,024).
_THREAD_MIN_ATOMS = 128
_THREADS = max(1, int(os.environ.get("DPRC_ACCOUNTANT_THREADS", min(2, os.cpu_count() or 1))))
_POOL: ThreadPoolExecutor | None = None
_POOL_GUARD = threading.Lock()


def set_threads(threads: int) -> None:
    """Evaluate the mixtures' blocks on ``threads`` threads from now on (1: in the caller)."""
    global _THREADS, _POOL  # noqa: PLW0603 - the module's one pool
    with _POOL_GUARD:
        if _POOL is not None:
            _POOL.shutdown(wait=True)
            _POOL = None
        _THREADS = max(1, int(threads))


def _pool() -> ThreadPoolExecutor:
    global _POOL  # noqa: PLW0603 - created on first use
    with _POOL_GUARD:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(_THREADS, thread_name_prefix="dprc-hidden-scale")
        return _POOL


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's threads: it starts a pool of its own."""
    global _POOL  # noqa: PLW0603
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool_in_child)


def _blocks(fn: Callable[[slice], np.ndarray], size: int, atoms: int) -> list[np.ndarray]:
    """``fn`` on the slices [i, i + _CHUNK) of range(size), in order; on the pool's threads
    when there are several blocks and threads and the law has at least ``_THREAD_MIN_ATOMS``
    atoms (the same values as in the caller: each block is computed alone)."""
    slices = [slice(i, min(i + _CHUNK, size)) for i in range(0, size, _CHUNK)]
    if len(slices) < 2 or _THREADS < 2 or atoms < _THREAD_MIN_ATOMS:
        return [fn(s) for s in slices]
    return list(_pool().map(fn, slices))


@dataclass(frozen=True)
class _Law:
    """The finite atoms of the scale law in units of σ (zero weights dropped)."""

    s: np.ndarray  # a_j / σ
    log_w: np.ndarray  # log w_j
    inf_weight: float

    @classmethod
    def of(cls, mech: StepMechanism) -> _Law:
        keep = mech.scale.weights > 0
        if not keep.any():
            raise ValueError("the scale law has no finite atom with positive weight")
        s = mech.scale.values[keep] / mech.sigma
        return cls(s, np.log(mech.scale.weights[keep]), float(mech.scale.inf_weight))

    @property
    def s_min(self) -> float:
        return float(self.s[0])

    @property
    def curvature(self) -> float:
        """An upper bound on h'' everywhere: h''(z) is the variance of s under the tilted law
        ∝ w_j exp(s_j z − s_j²/2), supported on [s_min, s_max], so at most (s_max − s_min)²/4
        (Popoviciu's inequality)."""
        return 0.25 * float(self.s[-1] - self.s[0]) ** 2


def _h_and_slope(z: np.ndarray, law: _Law) -> tuple[np.ndarray, np.ndarray]:
    """h(z) = log Σ_j w_j exp(s_j z − s_j²/2) and h'(z), by a stable log-sum-exp (in place on
    one (atoms, points) array per block of points: the accountant's hot loop)."""
    if z.size > _CHUNK:
        parts = _blocks(lambda b: np.stack(_h_and_slope(z[b], law)), z.size, law.s.size)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    expo = np.multiply.outer(law.s, z)
    expo += (law.log_w - 0.5 * law.s * law.s)[:, None]
    top = expo.max(axis=0)
    expo -= top
    np.exp(expo, out=expo)
    total = expo.sum(axis=0)
    return top + np.log(total), _weighted_sum(law.s, expo) / total


def _bracket(
    z: np.ndarray, h: np.ndarray, g: np.ndarray, target: np.ndarray, law: _Law
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From one evaluation (h, g) = (h(z), h'(z)): a bracket [t_lo, t_hi] of the root t of
    h(t) = target, and the Newton point z + e, e = (target − h)/g.

    With d = t − z: convexity (h above its tangent at z) gives d ≤ e. For e ≥ 0 (z below the
    root), h' ≤ g + V·u to the right (V ≥ h'' everywhere, :attr:`_Law.curvature`), so
    target − h ≤ g·d + V·d²/2, i.e. d ≥ 2·g·e / (g + √(g² + 2·V·g·e)). For e < 0, h' ≥
    max(g − V·u, s_min) at u to the left, so h − target ≥ Ψ(−d) with Ψ(x) = ∫₀ˣ max(g − V·u,
    s_min) du, increasing: −d ≤ Ψ⁻¹(h − target). The bracket's width is about V·e²/(2g); it is
    widened by a relative 1e-12 and by the round-off a computed h may carry."""
    diff = target - h
    e = diff / g
    curv = law.curvature
    s_min = law.s_min
    if curv > 0.0:
        # both cases at once: 2·diff / (g + √(g² + 2·V·diff)) is +below for e ≥ 0 and, for
        # e < 0 while −d ≤ x0, minus Ψ⁻¹(h − target) = 2·gap / (g + √(g² − 2·V·gap))
        d_lo = 2.0 * diff / (g + np.sqrt(np.maximum(g * g + (2.0 * curv) * diff, 0.0)))
        x0 = np.maximum(g - s_min, 0.0) / curv  # where g − V·u reaches s_min
        far = -d_lo > x0  # e < 0 beyond x0: Ψ is linear there, of slope s_min
        if far.any():
            xf, gf = x0[far], g[far]
            psi0 = gf * xf - 0.5 * curv * xf * xf
            d_lo[far] = -(xf + (-diff[far] - psi0) / s_min)
    else:  # a single atom: h is affine, the Newton point is the root
        d_lo = e.copy()
    margin = (
        _BRACKET_MARGIN * np.abs(z)
        + (_H_ROUNDING / s_min) * np.abs(h)
        + (_BRACKET_MARGIN + _H_ROUNDING / s_min)
    )
    return z + d_lo - margin, z + e + margin, z + e


def _solve(
    z: np.ndarray, target: np.ndarray, law: _Law
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Brackets of the roots of h(t) = target, by Newton's method from ``z``, and h' at the
    last point evaluated: every evaluation yields a valid bracket (:func:`_bracket`); a
    threshold stops once its bracket is narrower than a relative 1e-10 (usually after one
    evaluation from a table start, two or three from elsewhere: Newton's iterates after the
    first lie at or above the root and converge quadratically)."""
    z = np.array(z, dtype=np.float64)
    t_lo = np.empty(z.shape)
    t_hi = np.empty(z.shape)
    slope = np.empty(z.shape)
    idx = np.arange(z.size)
    for _ in range(_NEWTON_MAX):
        if idx.size == 0:
            return t_lo, t_hi, slope
        h, g = _h_and_slope(z[idx], law)
        lo, hi, nxt = _bracket(z[idx], h, g, target[idx], law)
        t_lo[idx], t_hi[idx], slope[idx] = lo, hi, g
        z[idx] = nxt
        idx = idx[hi - lo > _NEWTON_TOL * (1.0 + np.abs(hi))]
    raise RuntimeError(  # pragma: no cover - Newton on a convex h with h' ≥ s_min > 0 converges
        "hidden-scale threshold iteration did not converge"
    )


def _tangent_start(target: np.ndarray, law: _Law) -> np.ndarray:
    """Start points without a table: the smallest of the roots of the tangents
    log w + s·z − s²/2 of a coarse law (every ``group`` consecutive atoms merged at their
    largest scale: a few hundred atoms). Only a start: any point is one for :func:`_solve`."""
    group = max(1, law.s.size // 192)
    starts = np.arange(0, law.s.size, group)
    ends = np.minimum(starts + group, law.s.size) - 1
    s = law.s[ends]
    log_w = np.log(np.add.reduceat(np.exp(law.log_w), starts))
    return np.min((target[None, :] - log_w[:, None]) / s[:, None] + 0.5 * s[:, None], axis=0)


def _table_start(target: np.ndarray, law: _Law) -> np.ndarray:
    """Start points for many thresholds: h and h' on nodes spanning the extreme roots, and the
    cubic Hermite interpolant of the inverse of h between them (only a start: the brackets
    come from the evaluations of :func:`_solve`)."""
    ends = np.array([target.min(), target.max()])
    end_lo, end_hi, _ = _solve(_tangent_start(ends, law), ends, law)
    z_a, z_b = float(end_lo[0]), float(end_hi[1])
    width = float(law.s[-1] - law.s[0])
    nodes = int(math.ceil((z_b - z_a) * width / _TABLE_SPACING)) + 2
    nodes = min(max(nodes, 2), _TABLE_MAX_NODES, target.size)
    zs = np.linspace(z_a, z_b, nodes)
    hs, gs = _h_and_slope(zs, law)
    k = np.clip(np.searchsorted(hs, target) - 1, 0, nodes - 2)
    span = hs[k + 1] - hs[k]
    ok = span > 0
    u = np.clip(np.where(ok, (target - hs[k]) / np.where(ok, span, 1.0), 0.0), 0.0, 1.0)
    u2, u3 = u * u, u * u * u
    start = (
        (2 * u3 - 3 * u2 + 1) * zs[k]
        + (u3 - 2 * u2 + u) * span / gs[k]
        + (3 * u2 - 2 * u3) * zs[k + 1]
        + (u3 - u2) * span / gs[k + 1]
    )
    return np.clip(start, z_a, z_b)


def _thresholds(target: np.ndarray, law: _Law) -> tuple[np.ndarray, np.ndarray]:
    """A bracket [t_lo, t_hi] around the root t of h(t) = target, for each (finite) target.

    The bracket of :func:`_solve` (relative width ~1e-12) is widened on both sides by
    W = 1e-10·(1 + |t|)·h'(t)/s_min (plus the former 1e-12 margin, rounded up): the widest
    bracket the former iteration could return (Newton until a step below a relative 1e-10,
    then [z_n − (h(z_n) − target)/s_min, z_n]) lies inside it, so every δ evaluated at these
    ends is at least the former one (the profile only grows as the bracket widens). With a
    single atom h is affine, the former iteration's second Newton step landed on the root up
    to round-off, and twice the 1e-12 margin contains its bracket."""
    if target.size < _TABLE_MIN_POINTS or law.curvature == 0.0:
        start = _tangent_start(target, law)
    else:
        start = _table_start(target, law)
    t_lo, t_hi, slope = _solve(start, target, law)
    size = 1.0 + np.abs(t_hi) + 1e-6
    if law.curvature > 0.0:
        widen = _WIDEN * size * (_NEWTON_TOL * slope / law.s_min + _BRACKET_MARGIN)
    else:  # h affine: the former iteration's second step was the root (up to round-off)
        widen = 2.0 * _BRACKET_MARGIN * size
    return t_lo - widen, t_hi + widen


def _weighted_sum(w: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Σ_j w_j values[j, :] without BLAS: a matrix-vector product this small gains nothing
    from OpenBLAS's threads, which on a busy machine (a server's request threads, other
    processes) cost more than the product itself."""
    return np.einsum("j,jk->k", w, values)


def _phi_bar_mix(t: np.ndarray, law: _Law) -> np.ndarray:
    """Σ_j w_j Φ̄(t − s_j) (finite atoms only), in blocks of points (each block's Φ̄ computed
    in place in one array: the same values as ``ndtr(s − t)`` into a new one, without the
    second (atoms × 512) array and its page faults — ~40 % of this function's time)."""
    w = np.exp(law.log_w)
    if t.size == 0:
        return np.empty(t.shape)

    def block(b: slice) -> np.ndarray:
        x = np.empty((law.s.size, b.stop - b.start))
        np.subtract(law.s[:, None], t[None, b], out=x)
        return _weighted_sum(w, special.ndtr(x, out=x))

    return np.concatenate(_blocks(block, t.size, law.s.size))


def _phi_mix(t: np.ndarray, law: _Law) -> np.ndarray:
    """Σ_j w_j Φ(t − s_j) (finite atoms only), in blocks of points (in place, as
    :func:`_phi_bar_mix`)."""
    w = np.exp(law.log_w)
    if t.size == 0:
        return np.empty(t.shape)

    def block(b: slice) -> np.ndarray:
        x = np.empty((law.s.size, b.stop - b.start))
        np.subtract(t[None, b], law.s[:, None], out=x)
        return _weighted_sum(w, special.ndtr(x, out=x))

    return np.concatenate(_blocks(block, t.size, law.s.size))


def _times_exp(log_factor: np.ndarray, x: np.ndarray) -> np.ndarray:
    """e^log_factor · x for x ≥ 0 without inf·0 = NaN: summed in log space. Where x underflowed
    to 0 the product is 0, which can only raise the δ it is subtracted from (conservative);
    in exact arithmetic the product is at most 1 here, so it never overflows (q = 1 makes the
    add direction active for every ε, up to where e^ε alone overflows)."""
    with np.errstate(divide="ignore"):
        return np.exp(log_factor + np.log(x))


def _delta_block(
    eps: np.ndarray, law: _Law, q: float, direction: Direction, include_infinite: bool
) -> np.ndarray:
    log1m_q = math.log1p(-q) if q < 1.0 else -math.inf
    out = np.empty(eps.shape)
    inf_part = q * law.inf_weight if include_infinite else 0.0
    if direction == "remove":
        active = eps > log1m_q
        out[~active] = -np.expm1(np.minimum(eps[~active], 0.0))
        e = eps[active]
        target = log1p_expm1_over(e, q)  # log((e^ε − 1 + q)/q)
        ok = np.isfinite(target)
        # ε → log(1 − q)⁺: t → −∞ and δ → P1(ℝ ∪ {+∞}) − (1 − q) = q (less q·w_∞ without it)
        val = np.full(e.shape, q * (1.0 - law.inf_weight) + inf_part)
        if ok.any():
            t_lo, t_hi = _thresholds(target[ok], law)
            # P1(z > t_lo) − e^ε Φ̄(t_hi), with e^ε − (1 − q) = q·e^target
            val[ok] = (
                q * (_phi_bar_mix(t_lo, law) - np.exp(target[ok] + special.log_ndtr(-t_hi)))
                + (1.0 - q) * (special.ndtr(-t_lo) - special.ndtr(-t_hi))
                + inf_part
            )
        out[active] = val
    else:
        active = eps < -log1m_q
        out[~active] = 0.0
        e = eps[active]
        target = log1p_expm1_over(-e, q)  # log((e^{−ε} − 1 + q)/q)
        ok = np.isfinite(target)
        # ε → −log(1 − q)⁻: t → −∞ and δ → 0
        val = np.zeros(e.shape)
        if ok.any():
            eo = e[ok]
            t_lo, t_hi = _thresholds(target[ok], law)
            # Φ(t_hi) − e^ε [(1 − q) Φ(t_lo) + q Σ w_j Φ(t_lo − s_j)]
            val[ok] = (
                -np.expm1(eo + log1m_q) * special.ndtr(t_hi)
                + np.exp(eo + log1m_q) * (special.ndtr(t_hi) - special.ndtr(t_lo))
                - _times_exp(eo + math.log(q), _phi_mix(t_lo, law))
            )
        out[active] = val
    return out


def hidden_delta(
    eps: np.ndarray, mech: StepMechanism, direction: Direction, include_infinite: bool = True
) -> np.ndarray:
    """δ(ε) of one hidden-scale step in one direction: an upper bound on the profile of the
    pair with the discrete scale law ``mech.scale`` (see the module docstring).

    ``include_infinite=False`` leaves out the atom at a = +∞ (a constant q·w_∞ in the remove
    direction; used to size the loss range, that part ends up at +∞ anyway)."""
    eps = np.asarray(eps, dtype=np.float64).reshape(-1)
    out = _delta_block(eps, _Law.of(mech), mech.q, direction, include_infinite)
    return np.clip(out, 0.0, 1.0)


def hidden_lower_tail(t: np.ndarray, mech: StepMechanism, direction: Direction) -> np.ndarray:
    """P(L < t) of the step's privacy loss under the first distribution of the pair (used to
    size the loss range only: accuracy, not soundness, depends on it)."""
    t = np.asarray(t, dtype=np.float64).reshape(-1)
    law = _Law.of(mech)
    q = mech.q
    log1m_q = math.log1p(-q) if q < 1.0 else -math.inf
    out = np.empty(t.shape)
    if direction == "remove":  # L < ℓ ⇔ z < root of h = log((e^ℓ − 1 + q)/q), under P1
        active = t > log1m_q
        out[~active] = 0.0
        target = log1p_expm1_over(t[active], q)
        val = np.zeros(target.shape)
        ok = np.isfinite(target)
        if ok.any():
            _, z = _thresholds(target[ok], law)
            val[ok] = (1.0 - q) * special.ndtr(z) + q * _phi_mix(z, law)
        out[active] = val
    else:  # L = −log LR < ℓ ⇔ z > root of h = log((e^{−ℓ} − 1 + q)/q), under P0
        active = t < -log1m_q
        out[~active] = 1.0
        target = log1p_expm1_over(-t[active], q)
        val = np.ones(target.shape)
        ok = np.isfinite(target)
        if ok.any():
            z, _ = _thresholds(target[ok], law)
            val[ok] = special.ndtr(-z)
        out[active] = val
    return out


def hidden_loss_range(
    mech: StepMechanism, direction: Direction, tail: float, precise: bool = False
) -> tuple[float, float]:
    """[lo, hi] with δ(hi) ≤ tail (the mass above hi goes to +∞) and P(L < lo) ≤ tail (the
    mass below lo is rounded up to lo). Only accuracy depends on them: any range gives a
    pessimistic PLD. The ends are bisected for one call (:data:`_RANGE_HALVINGS`), or to 1e-12
    with ``precise`` (the legacy law's ends)."""
    hard_lo, hard_hi = loss_bounds(mech.q, direction)
    probe = np.concatenate([-np.logspace(4, -9, 140), [0.0], np.logspace(-9, 4, 140)])
    if math.isfinite(hard_hi):
        hi = hard_hi
    else:
        d = hidden_delta(probe, mech, direction, include_infinite=False)
        idx = int(np.argmax(d <= tail))
        if d[idx] > tail:
            raise ValueError("privacy loss tail does not vanish below 1e4; parameters too extreme")

        def small(x: np.ndarray) -> np.ndarray:
            return hidden_delta(x, mech, direction, False) <= tail

        end = float(probe[max(idx - 1, 0)]), float(probe[idx])
        if precise:
            hi = bisect(small, *end)[1]
        else:
            hi = bisect(small, *end, iters=_RANGE_HALVINGS, rel_tol=None)[1]
    lt = hidden_lower_tail(probe, mech, direction)
    above = np.nonzero(lt > tail)[0]
    first = int(above[0]) if above.size else probe.size - 1

    def heavy(x: np.ndarray) -> np.ndarray:
        return hidden_lower_tail(x, mech, direction) > tail

    # the largest x with P(L < x) ≤ tail lies in [probe[first − 1], probe[first]]; the
    # bisection's lower end has P(L < a) ≤ tail
    a = probe[max(first - 1, 0)]
    if first > 0 and precise:
        b = bisect(heavy, float(a), float(probe[first]))[1]
        a = b - 1e-12 * max(1.0, abs(b))
    elif first > 0:
        a = bisect(heavy, float(a), float(probe[first]), _RANGE_HALVINGS, rel_tol=None)[0]
    lo = max(a, hard_lo) if math.isfinite(hard_lo) else a
    return float(min(lo, hi)), float(hi)


def hidden_step_geometry(
    mech: StepMechanism, tail: float, precise_range: bool = False
) -> StepGeometry:
    """Loss ranges, bulk, mean and std of the hidden-scale step in both directions. ``mech``
    may use a coarser (still dominating) scale than the PLD: only accuracy depends on it.
    ``precise_range``: the loss range's ends as the legacy law had them (hidden_loss_range)."""

    def loss_range_of(m: StepMechanism, direction: Direction, t: float) -> tuple[float, float]:
        return hidden_loss_range(m, direction, t, precise_range)

    return step_geometry(mech, tail, profile=hidden_delta, loss_range_of=loss_range_of)


def hidden_step_pmf(
    mech: StepMechanism,
    direction: Direction,
    h: float,
    lims: tuple[float, float],
    bulk: tuple[float, float] | None = None,
) -> pld_pmf.DensePLDPmf:
    """Pessimistic (connect-the-dots) per-step PMF on the grid h·ℤ for one direction."""
    return step_pmf(mech, direction, h, 0.0, lims, bulk, profile=hidden_delta)


def hidden_step_pld(
    mech: StepMechanism,
    h: float,
    tail: float,
    geometry: StepGeometry | None = None,
    sparse: bool = True,
) -> PrivacyLossDistribution:
    """Pessimistic per-step PLD (both adjacency directions) of the hidden-scale mechanism."""
    geometry = geometry if geometry is not None else hidden_step_geometry(mech, tail)
    return step_pld(mech, h, tail, geometry, sparse, profile=hidden_delta)


__all__ = [
    "hidden_delta",
    "hidden_loss_range",
    "hidden_lower_tail",
    "hidden_step_geometry",
    "hidden_step_pld",
    "hidden_step_pmf",
]
