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

and δ = 1 − e^ε (remove) / 0 (add) outside those ranges. t is found by Newton's method on the
convex h (every iterate after the first lies at or above the root, so the iteration descends
monotonically); from the final iterate t_n ≥ t and the slope bound h' ≥ s_min the root lies in
``[t_n − (h(t_n) − target)/s_min, t_n]`` (widened by a relative 1e-12 against round-off), and δ is
evaluated at the ends of that bracket in the direction that can only raise it
(``P1(z > t) ≤ P1(z > t_lo)``, ``P0(z > t) ≥ P0(z > t_hi)``, ...). So the profile computed here
is an upper bound on the profile of the discrete law, and the connect-the-dots PMF built from it
(:func:`random_scale_pld.connect_dots_probabilities`, the same construction and argument as the
revealed-scale PLD) dominates the mechanism in each direction, for every ε.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
    step_geometry,
    step_pld,
    step_pmf,
)

_CHUNK = 512  # thresholds per vectorised block (bounds memory to ~bins × 512 doubles)
_NEWTON_MAX = 200  # Newton iterations per block at most (typically 5–10 from the start point)
_NEWTON_TOL = 1e-10  # relative step below which the iteration stops (the bracket covers the rest)
_BRACKET_MARGIN = 1e-12  # relative widening of the root bracket against round-off

ProfileFn = Callable[[np.ndarray, Direction], np.ndarray]


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


def _h_and_slope(z: np.ndarray, law: _Law) -> tuple[np.ndarray, np.ndarray]:
    """h(z) = log Σ_j w_j exp(s_j z − s_j²/2) and h'(z), by a stable log-sum-exp (in place on
    one (atoms, points) array: the accountant's hot loop)."""
    expo = np.multiply.outer(law.s, z)
    expo += (law.log_w - 0.5 * law.s * law.s)[:, None]
    top = expo.max(axis=0)
    expo -= top
    np.exp(expo, out=expo)
    total = expo.sum(axis=0)
    return top + np.log(total), (law.s @ expo) / total


def _coarse(law: _Law, atoms: int = 192) -> _Law:
    """A law of about ``atoms`` atoms (consecutive atoms merged, each group at its largest
    scale) whose root of h only serves as the starting point of the fine iteration."""
    group = max(1, law.s.size // atoms)
    if group == 1:
        return law
    starts = np.arange(0, law.s.size, group)
    ends = np.minimum(starts + group, law.s.size) - 1
    w = np.add.reduceat(np.exp(law.log_w), starts)
    return _Law(law.s[ends], np.log(w), law.inf_weight)


def _newton(z: np.ndarray, target: np.ndarray, law: _Law, min_steps: int) -> tuple:
    """Newton's method on h(z) = target from ``z`` (at least ``min_steps`` steps per point);
    returns (z_n, h(z_n)) of the last iterate evaluated, whose step was below the tolerance."""
    z = z.copy()
    h_last = np.empty(z.shape)
    z_last = np.empty(z.shape)
    active = np.ones(z.shape, dtype=bool)
    for it in range(_NEWTON_MAX):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            return z_last, h_last
        h, slope = _h_and_slope(z[idx], law)
        z_last[idx], h_last[idx] = z[idx], h
        step = (h - target[idx]) / slope
        z[idx] = z[idx] - step
        if it + 1 >= min_steps:
            active[idx] = np.abs(step) > _NEWTON_TOL * (1.0 + np.abs(z[idx]))
    raise RuntimeError(  # pragma: no cover - Newton on a convex h with h' ≥ s_min > 0 converges
        "hidden-scale threshold iteration did not converge"
    )


def _thresholds(target: np.ndarray, law: _Law) -> tuple[np.ndarray, np.ndarray]:
    """A bracket [t_lo, t_hi] around the root t of h(t) = target, for each (finite) target.

    The root of a coarse law's h is the starting point; then Newton on the fine h. h is convex,
    so every fine iterate after the first lies at or above the root: the last one evaluated,
    z_n (at least the second), satisfies t ≤ z_n, and h' ≥ s_min gives
    t ≥ z_n − (h(z_n) − target)/s_min."""
    coarse = _coarse(law)
    # h(z) ≥ log w_j + s_j z − s_j²/2 for every j, so the root lies at or below this point.
    z0 = np.min(
        (target[None, :] - coarse.log_w[:, None]) / coarse.s[:, None] + 0.5 * coarse.s[:, None],
        axis=0,
    )
    if coarse is not law:
        z0, _ = _newton(z0, target, coarse, 1)
    z, h = _newton(z0, target, law, 2)
    margin = _BRACKET_MARGIN * (1.0 + np.abs(z))
    t_lo = z - np.maximum(h - target, 0.0) / law.s_min - margin
    return t_lo, z + margin


def _phi_bar_mix(t: np.ndarray, law: _Law) -> np.ndarray:
    """Σ_j w_j Φ̄(t − s_j) (finite atoms only)."""
    return np.exp(law.log_w) @ special.ndtr(law.s[:, None] - t[None, :])


def _phi_mix(t: np.ndarray, law: _Law) -> np.ndarray:
    """Σ_j w_j Φ(t − s_j) (finite atoms only)."""
    return np.exp(law.log_w) @ special.ndtr(t[None, :] - law.s[:, None])


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
    law = _Law.of(mech)
    out = np.empty(eps.shape)
    for start in range(0, eps.size, _CHUNK):
        sl = slice(start, start + _CHUNK)
        out[sl] = _delta_block(eps[sl], law, mech.q, direction, include_infinite)
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


def _bisect(fn: Callable[[float], bool], lo: float, hi: float, iters: int = 60) -> float:
    """With fn(lo) false and fn(hi) true (fn monotone), a point near the switch, from above."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if fn(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(1.0, abs(hi)):
            break
    return hi


def hidden_loss_range(
    mech: StepMechanism, direction: Direction, tail: float
) -> tuple[float, float]:
    """[lo, hi] with δ(hi) ≤ tail (the mass above hi goes to +∞) and P(L < lo) ≤ tail (the
    mass below lo is rounded up to lo)."""
    hard_lo, hard_hi = loss_bounds(mech.q, direction)
    probe = np.concatenate([-np.logspace(4, -9, 140), [0.0], np.logspace(-9, 4, 140)])
    if math.isfinite(hard_hi):
        hi = hard_hi
    else:
        d = hidden_delta(probe, mech, direction, include_infinite=False)
        idx = int(np.argmax(d <= tail))
        if d[idx] > tail:
            raise ValueError("privacy loss tail does not vanish below 1e4; parameters too extreme")

        def small(x: float) -> bool:
            return bool(hidden_delta(np.array([x]), mech, direction, False)[0] <= tail)

        hi = _bisect(small, probe[max(idx - 1, 0)], probe[idx])
    lt = hidden_lower_tail(probe, mech, direction)
    above = np.nonzero(lt > tail)[0]
    first = int(above[0]) if above.size else probe.size - 1

    def heavy(x: float) -> bool:
        return bool(hidden_lower_tail(np.array([x]), mech, direction)[0] > tail)

    # the largest x with P(L < x) ≤ tail lies in [probe[first − 1], probe[first]]
    a = probe[max(first - 1, 0)]
    if first > 0:
        b = _bisect(heavy, a, probe[first])
        a = b - 1e-12 * max(1.0, abs(b))
    lo = max(a, hard_lo) if math.isfinite(hard_lo) else a
    return float(min(lo, hi)), float(hi)


def hidden_step_geometry(mech: StepMechanism, tail: float) -> StepGeometry:
    """Loss ranges, bulk, mean and std of the hidden-scale step in both directions. ``mech``
    may use a coarser (still dominating) scale than the PLD: only accuracy depends on it."""
    return step_geometry(mech, tail, profile=hidden_delta, loss_range_of=hidden_loss_range)


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
