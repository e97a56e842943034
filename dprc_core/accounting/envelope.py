"""Envelope CDFs of the randomized-clipping norm ratio (docs/design.md §4; paper Prop. 1, B.8,
B.9.1).

With Hutchinson's estimator the squared-norm ratio ``Y = n̂²/‖g‖²`` is distributed as
``Σ_i λ_i χ²_i(k)/k`` with λ on the simplex (the normalised eigenvalues of every randomized
layer together). The accountant needs a data-independent ``F`` with ``F(x) ≥ P(Y ≤ x)`` for
every admissible λ; the sensitivity scale ``a = Y^{-1/2}`` of the envelope variable then
stochastically dominates the true one.

* Dimension-free envelope (``rank=None``, the default and the only form used for Hutch++ and
  for models that mix exact and randomized layers): ``F(x) = F_{χ²(k)/k}(x)`` for x < 1 and 1
  for x ≥ 1.
* Rank-dependent envelope (``rank=D``, Hutch only, every clipped layer randomized, D the total
  rank Σ_l min(p_l, d_l)): three regions of Proposition 1 — the vertex CDF for x ≤ 1, the
  uniform CDF ``F_{χ²(Dk)/(Dk)}`` for x ≥ x₊, and in between the supremum over two-component
  mixtures ``λ/(ik) χ²(ik) + (1−λ)/(jk) χ²(jk)``, i + j ≤ D, λ ∈ [0, 1/2] (B.9.1), never below
  the vertex or the uniform CDF. x₊ is found by bisection using the single-crossing property.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import optimize, special

# Largest total rank for which the middle region and x₊ are computed (cost grows as D²).
# Above it the dimension-free envelope, valid for every D, is used instead.
RANK_ENVELOPE_MAX = 32

_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(64)
_QUANTILE_TAIL = 1e-17
_LAMBDA_GRID = np.linspace(0.0, 0.5, 17)
# A two-component CDF must beat the uniform one (computed by the same quadrature, so that the
# quadrature bias cancels) by more than this to count as "above".
_CROSSING_TOL = 1e-10
# Relative safety margin on x₊ − 1 used when the PLD is built (see docs/accounting.md).
XPLUS_SAFETY = 0.02


def check_k(k: int) -> int:
    """Validate the projection dimension (the envelope proof needs χ²(k) log-concave: k ≥ 2)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be an integer projection dimension, got {k!r}")
    if k < 2:
        raise ValueError(
            f"k must be >= 2 for randomized clipping, got {k}: the envelope (Proposition 1) "
            "relies on the log-concavity of chi2(k), which fails for k = 1"
        )
    return int(k)


def check_rank(rank: int | None) -> int | None:
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise ValueError(f"rank must be a positive integer or None, got {rank!r}")
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    return int(rank)


def chi2_mean_cdf(x: np.ndarray | float, dof: float) -> np.ndarray:
    """CDF of χ²(dof)/dof at x (0 for x ≤ 0)."""
    x = np.asarray(x, dtype=np.float64)
    return special.gammainc(dof / 2.0, np.maximum(x, 0.0) * dof / 2.0)


def _gamma_logpdf(u: np.ndarray, shape: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (
        special.xlogy(shape - 1.0, u / scale) - u / scale - special.gammaln(shape) - np.log(scale)
    )


def two_component_cdf(
    x: float,
    k: int,
    i: np.ndarray | float,
    j: np.ndarray | float,
    lam: np.ndarray | float,
) -> np.ndarray:
    """``P(λ/(ik) χ²(ik) + (1−λ)/(jk) χ²(jk) ≤ x)`` for broadcast arrays i, j, λ ∈ [0, 1].

    Computed as ``∫ f_S(u) F_B(x − u) du`` where S is the component with the smaller standard
    deviation (a narrow, smooth density) and B the wider one, by 64-point Gauss-Legendre
    quadrature between the 1e-17 quantiles of S.
    """
    i, j, lam = np.broadcast_arrays(
        np.asarray(i, np.float64), np.asarray(j, np.float64), np.asarray(lam, np.float64)
    )
    shape1, scale1 = i * k / 2.0, 2.0 * lam / (i * k)
    shape2, scale2 = j * k / 2.0, 2.0 * (1.0 - lam) / (j * k)
    swap = np.sqrt(shape1) * scale1 > np.sqrt(shape2) * scale2
    shape_s = np.where(swap, shape2, shape1)
    scale_s = np.where(swap, scale2, scale1)
    shape_b = np.where(swap, shape1, shape2)
    scale_b = np.where(swap, scale1, scale2)
    out = np.empty(shape_s.shape)
    degenerate = scale_s <= 0.0
    out[degenerate] = special.gammainc(shape_b[degenerate], max(x, 0.0) / scale_b[degenerate])
    nd = ~degenerate
    a_s, s_s, a_b, s_b = shape_s[nd], scale_s[nd], shape_b[nd], scale_b[nd]
    lo = special.gammaincinv(a_s, _QUANTILE_TAIL) * s_s
    hi = np.minimum(special.gammainccinv(a_s, _QUANTILE_TAIL) * s_s, x)
    mid, half = (hi + lo) / 2.0, np.maximum(hi - lo, 0.0) / 2.0
    u = mid[:, None] + half[:, None] * _GL_NODES[None, :]
    dens = np.exp(_gamma_logpdf(np.maximum(u, 1e-300), a_s[:, None], s_s[:, None]))
    cdf_b = special.gammainc(a_b[:, None], np.maximum(x - u, 0.0) / s_b[:, None])
    out[nd] = np.where(hi > lo, half * (dens * cdf_b * _GL_WEIGHTS).sum(axis=1), 0.0)
    return np.clip(out, 0.0, 1.0)


@functools.lru_cache(maxsize=64)
def _pairs(rank: int) -> tuple[np.ndarray, np.ndarray]:
    ii, jj = np.meshgrid(np.arange(1, rank + 1), np.arange(1, rank + 1), indexing="ij")
    keep = (ii + jj) <= rank
    return ii[keep].astype(np.float64), jj[keep].astype(np.float64)


def _sup_two_component(
    x: float, k: int, rank: int, hint: tuple[float, float, float] | None = None
) -> tuple[float, tuple[float, float, float]]:
    """sup over i + j ≤ rank, λ ∈ [0, 1/2] of the two-component CDF at x (grid + Brent)."""
    ii, jj = _pairs(rank)
    n_lam = _LAMBDA_GRID.size
    ii_all, jj_all = np.repeat(ii, n_lam), np.repeat(jj, n_lam)
    lam_all = np.tile(_LAMBDA_GRID, ii.size)
    vals = two_component_cdf(x, k, ii_all, jj_all, lam_all)
    order = np.argsort(vals)[::-1][:4]
    best_val, best_arg = -1.0, (1.0, 1.0, 0.0)
    candidates = [(ii_all[o], jj_all[o], lam_all[o]) for o in order]
    if hint is not None:
        candidates.append(hint)
    step = _LAMBDA_GRID[1] - _LAMBDA_GRID[0]
    for ci, cj, cl in candidates:
        lo, hi = max(0.0, cl - step), min(0.5, cl + step)

        def neg(lam: float, ci: float = ci, cj: float = cj) -> float:
            return -float(two_component_cdf(x, k, ci, cj, lam)[()])

        res = optimize.minimize_scalar(
            neg, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7}
        )
        for lam_c, val_c in ((res.x, -res.fun), (cl, -neg(cl))):
            if val_c > best_val:
                best_val, best_arg = val_c, (ci, cj, float(lam_c))
    return max(best_val, float(vals.max())), best_arg


@functools.lru_cache(maxsize=256)
def _x_plus_cached(k: int, rank: int) -> float:
    if rank == 1:
        return 1.0
    dof_u = rank * k

    def above_uniform(x: float, hint: tuple[float, float, float] | None) -> tuple[bool, tuple]:
        # The uniform spectrum is the two-component mixture (1, D-1, 1/D).
        f_u = max(
            float(chi2_mean_cdf(x, dof_u)),
            float(two_component_cdf(x, k, 1.0, rank - 1.0, 1.0 / rank)[()]),
        )
        if hint is not None:  # cheap check with the previous maximiser first
            v = float(two_component_cdf(x, k, hint[0], hint[1], hint[2])[()])
            if v > f_u + _CROSSING_TOL:
                return True, hint
        val, arg = _sup_two_component(x, k, rank, hint)
        return val > f_u + _CROSSING_TOL, arg

    lo, hi = 1.0, min(2.0, 1.0 + 8.0 / dof_u)
    hint: tuple[float, float, float] | None = None
    flag, hint = above_uniform(hi, None)
    if flag:
        lo, hi = hi, 2.0
    # Bisection to a relative precision of 1e-5 on x₊ − 1.
    while hi - lo > 1e-5 * (hi - 1.0):
        mid = 0.5 * (lo + hi)
        flag, arg = above_uniform(mid, hint)
        if flag:
            lo, hint = mid, arg
        else:
            hi = mid
    return hi


def x_plus(k: int, rank: int) -> float:
    """Proposition 1 threshold x₊(k, D): above it the uniform CDF F_{χ²(Dk)/(Dk)} is the envelope.

    Found by bisection on [1, 2] (single crossing): x lies below x₊ iff some two-component
    mixture (B.9.1) has a larger CDF at x than the uniform one. The returned value is the upper
    end of the final bracket plus a relative margin of 1e-3 on x₊ − 1. For D = 1 the vertex and
    the uniform spectrum coincide and 1.0 is returned. Asymptotically x₊ = 1 + 2/(Dk) + O(k⁻²).
    """
    k = check_k(k)
    checked_rank = check_rank(rank)
    if checked_rank is None:
        raise ValueError("x_plus needs an integer rank D >= 1")
    if checked_rank > RANK_ENVELOPE_MAX:
        raise ValueError(
            f"x_plus is computed for rank <= {RANK_ENVELOPE_MAX} (cost grows as D^2); "
            f"got {checked_rank}"
        )
    return _x_plus_cached(k, checked_rank)


def envelope_cdf(x: np.ndarray | float, k: int, rank: int | None = None) -> np.ndarray:
    """Envelope CDF F(x; Y) ≥ sup_λ P(Σ λ_i χ²_i(k)/k ≤ x) (docs/design.md §4).

    ``rank=None``: dimension-free envelope (valid for Hutch, Hutch++, any layer mix).
    ``rank=D``: three-region envelope of Proposition 1 for Hutch with total rank D; for
    D > RANK_ENVELOPE_MAX the dimension-free envelope is returned (it is valid for every D).
    Each x in the middle region (1, x₊) costs a numerical maximisation over (i, j, λ).
    """
    k = check_k(k)
    rank = check_rank(rank)
    x_arr = np.asarray(x, dtype=np.float64)
    flat = x_arr.reshape(-1)
    vertex = chi2_mean_cdf(flat, k)
    if rank is None or rank > RANK_ENVELOPE_MAX:
        out = np.where(flat >= 1.0, 1.0, vertex)
        return out.reshape(x_arr.shape)
    if rank == 1:
        return vertex.reshape(x_arr.shape)
    xp = x_plus(k, rank)
    uniform = chi2_mean_cdf(flat, rank * k)
    out = np.where(flat <= 1.0, vertex, np.maximum(uniform, vertex))
    hint = None
    for idx in np.nonzero((flat > 1.0) & (flat < xp))[0]:
        val, hint = _sup_two_component(float(flat[idx]), k, rank, hint)
        out[idx] = max(out[idx], val)
    return out.reshape(x_arr.shape)


def scale_tail(a: np.ndarray, k: int, rank: int | None) -> np.ndarray:
    """T(a) = F((1/a²)⁻): an upper bound on P(Z > a) for the true sensitivity scale Z.

    Used to discretise the scale a = Y^{-1/2}. In the middle region (1, x₊) of the rank
    envelope the bound ``sup_{x < x₊} F(x) ≤ F_u(x₊)`` is used (monotone CDFs, and at x₊ the
    uniform CDF is the envelope), which avoids the two-component optimisation altogether.
    """
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide="ignore"):
        x = np.where(a > 0, 1.0 / np.square(a), np.inf)
    vertex = chi2_mean_cdf(np.minimum(x, 1.0), k)  # F(x⁻) = F(x) off the atom at x = 1
    if rank is None or rank > RANK_ENVELOPE_MAX:
        return np.where(x > 1.0, 1.0, vertex)
    if rank == 1:
        return chi2_mean_cdf(x, k)
    xp = 1.0 + (1.0 + XPLUS_SAFETY) * (x_plus(k, rank) - 1.0)
    uniform = np.maximum(chi2_mean_cdf(x, rank * k), chi2_mean_cdf(x, k))
    middle = float(chi2_mean_cdf(xp, rank * k))
    return np.where(x <= 1.0, vertex, np.where(x < xp, middle, uniform))


__all__ = [
    "RANK_ENVELOPE_MAX",
    "check_k",
    "check_rank",
    "chi2_mean_cdf",
    "envelope_cdf",
    "scale_tail",
    "two_component_cdf",
    "x_plus",
]
