"""Discrete, stochastically dominating versions of the sensitivity scale a = Y^{-1/2}.

A :class:`ScaleDistribution` is a finite list of scales ``a_j`` (in units of the clipping norm
C) with weights, plus a mass at ``a = +∞``. :func:`envelope_scale` builds one from the envelope
tail ``T(a) = F((1/a²)⁻) ≥ P(a_true > a)`` (see :func:`envelope.scale_tail`):

* bins ``(a_{j-1}, a_j]`` get weight ``T(a_{j-1}) − T(a_j)`` and are represented by their
  **upper** edge ``a_j`` (rounding the scale up);
* the mass ``T(a_max)`` above the last edge is put at ``a = +∞``.

For every a the discrete variable Ã then satisfies ``P(Ã > a) ≥ T(a) ≥ P(a_true > a)``, so Ã
stochastically dominates the true scale and, by the coupling lemma (paper Lemma B.3: a larger
scale is a post-processing-dominated pair), the mechanism with scale Ã dominates the real one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from dprc_core.accounting.envelope import RANK_ENVELOPE_MAX, XPLUS_SAFETY, scale_tail, x_plus

# Relative width of the scale bins (a_j / a_{j-1} − 1). Bins are uniform in log a: rounding a
# up by a relative r/2 on average costs about 1–2·r in ε, and the bulk of the scale
# distribution and its far tail matter alike (docs/accounting.md), so r = 0.1% keeps that
# pessimism near 0.1–0.2%.
DEFAULT_RELATIVE_WIDTH = 0.001


@dataclass(frozen=True)
class ScaleDistribution:
    """Sensitivity multipliers ``values`` (increasing, finite, > 0) with ``weights``, and the
    weight ``inf_weight`` of an infinite scale (the example is revealed outright)."""

    values: np.ndarray
    weights: np.ndarray
    inf_weight: float

    def __post_init__(self) -> None:
        if self.values.shape != self.weights.shape or self.values.ndim != 1:
            raise ValueError("values and weights must be 1-d arrays of equal length")
        if np.any(self.values <= 0) or np.any(np.diff(self.values) <= 0):
            raise ValueError("scale values must be positive and strictly increasing")
        if np.any(self.weights < 0) or self.inf_weight < 0:
            raise ValueError("scale weights must be non-negative")

    @property
    def total(self) -> float:
        return float(self.weights.sum() + self.inf_weight)


def exact_scale() -> ScaleDistribution:
    """The deterministic scale a = 1 (exact per-sample norms)."""
    return ScaleDistribution(np.array([1.0]), np.array([1.0]), 0.0)


def _scale_range(k: int, rank: int | None, inf_budget: float) -> tuple[float, float]:
    """(a_min, a_max): T(a_max) ≤ inf_budget; below a_min the mass (≤ 1e-18) is lumped."""
    y_low = special.gammaincinv(k / 2.0, inf_budget) * 2.0 / k  # F_k(y_low) = inf_budget
    a_max = float(1.0 / np.sqrt(max(y_low, 1e-300)))
    if rank is None or rank > RANK_ENVELOPE_MAX:
        return 1.0, a_max
    dof = k if rank == 1 else rank * k
    y_high = special.gammainccinv(dof / 2.0, 1e-18) * 2.0 / dof
    return float(1.0 / np.sqrt(y_high)), a_max


def envelope_scale(
    k: int,
    rank: int | None,
    inf_budget: float,
    relative_width: float = DEFAULT_RELATIVE_WIDTH,
    a_cap: float = np.inf,
) -> ScaleDistribution:
    """Dominating discrete scale for the envelope of (k, rank).

    The largest finite scale a_max is the smaller of ``a_cap`` and the point where the tail
    ``T(a_max)`` drops to ``inf_budget``; ``T(a_max)`` goes to a = +∞ (with a cap it may exceed
    the budget: that mass is then charged to δ in full, which is sound, and can make ε
    infinite for heavy-tailed small-k envelopes). Edges are uniform in log a with
    ``a_j / a_{j-1} ≤ 1 + relative_width``; the kinks of T (a = 1 and, for the rank envelope,
    a = x₊^{-1/2}) are always edges.
    """
    if not 0 < relative_width < 1:
        raise ValueError("relative_width must be in (0, 1)")
    a_min, a_max = _scale_range(k, rank, inf_budget)
    a_max = max(min(a_max, a_cap), a_min * (1.0 + relative_width))
    t_lo, t_hi = np.log(a_min), np.log(a_max)
    n = max(int(np.ceil((t_hi - t_lo) / np.log1p(relative_width))), 1)
    edges_t = np.linspace(t_lo, t_hi, n + 1)
    kinks = [0.0]
    if rank is not None and 1 < rank <= RANK_ENVELOPE_MAX:
        xp = 1.0 + (1.0 + XPLUS_SAFETY) * (x_plus(k, rank) - 1.0)
        kinks.append(-0.5 * np.log(xp))
    edges_t = np.unique(np.concatenate([edges_t, [kk for kk in kinks if t_lo < kk < t_hi]]))
    edges = np.exp(edges_t)
    # T is non-increasing in theory; against round-off, raise (never lower) a value to the
    # largest tail to its right, which only moves mass towards larger scales.
    tails = np.maximum.accumulate(scale_tail(edges, k, rank)[::-1])[::-1]
    # Lowest atom: everything at or below edges[0] (T = 1 below a_min) sits at edges[0].
    weights = np.maximum(np.concatenate([[1.0 - tails[0]], tails[:-1] - tails[1:]]), 0.0)
    keep = weights > 0
    keep[-1] = True
    return ScaleDistribution(edges[keep], weights[keep], float(tails[-1]))


__all__ = [
    "DEFAULT_RELATIVE_WIDTH",
    "ScaleDistribution",
    "envelope_scale",
    "exact_scale",
]
