"""Hockey-stick divergences of the Poisson-subsampled Gaussian mechanism, vectorised.

Units: the noise has standard deviation 1 and the (conditional) sensitivity is ``s = a / σ``.
For a pair of distributions (P, Q) the hockey-stick divergence is
``δ(ε) = sup_S P(S) − e^ε Q(S) = E_P[(1 − e^{ε − L})_+]`` with ``L = log dP/dQ``.

Add/remove adjacency under Poisson sampling with rate q gives two pairs (the naming follows
Google's ``dp_accounting``):

* ``remove``: P = (1 − q) N(0, 1) + q N(s, 1),  Q = N(0, 1)
* ``add``:    P = N(0, 1),  Q = (1 − q) N(0, 1) + q N(s, 1)

Both reduce to the plain Gaussian divergence
``δ_G(ε; s) = Φ(−ε/s + s/2) − e^ε Φ(−ε/s − s/2)`` (Balle & Wang 2018):

* remove: ``δ(ε) = q · δ_G(log(1 + (e^ε − 1)/q); s)`` for ε > log(1 − q), else ``1 − e^ε``;
* add:    ``δ(ε) = (1 − (1 − q) e^ε) · δ_G(−log(1 + (e^{−ε} − 1)/q); s)`` for
  ε < −log(1 − q), else 0.

Both are non-decreasing in ``s`` for every ε: the pair with sensitivity s' > s maps onto the
pair with sensitivity s by the same Markov kernel ``x ↦ (s/s') x + N(0, 1 − (s/s')²)`` applied
to both distributions (post-processing). The limits ``s → ∞`` are exposed as
:func:`delta_infinite_sensitivity`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy import special

Direction = Literal["remove", "add"]
DIRECTIONS: tuple[Direction, Direction] = ("remove", "add")


def log1p_expm1_over(x: np.ndarray, q: float) -> np.ndarray:
    """log(1 + (e^x − 1)/q) for x > log(1 − q), stable for every x.

    |x| ≤ 1: ``log1p(expm1(x)/q)``; otherwise ``x + log1p(−(1 − q) e^{−x}) − log q``.
    """
    x = np.asarray(x, dtype=np.float64)
    if q >= 1.0:
        return x.copy()
    far = np.abs(x) > 1.0
    xs = np.where(far, 0.0, x)
    xb = np.where(far, x, 2.0)
    small_val = np.log1p(np.expm1(xs) / q)
    with np.errstate(over="ignore", divide="ignore"):
        big_val = xb + np.log1p(-(1.0 - q) * np.exp(-xb)) - np.log(q)
    return np.where(far, big_val, small_val)


# Beyond z = 37.5 the standard normal tail is below 1e-300; δ_G ≤ Φ̄(z) is then zero in float64.
_Z_UNDERFLOW = 37.5


def delta_gaussian(eps: np.ndarray, s: np.ndarray) -> np.ndarray:
    """δ_G(ε; s) for the pair (N(s, 1), N(0, 1)); ``eps`` shape (n,), ``s`` shape (m,) → (m, n).

    ``Φ̄(z) − e^ε Φ̄(z + s)`` with z = ε/s − s/2. ``ndtr(−·)`` keeps full relative precision in
    the far tail; where Φ̄(z + s) may underflow (z + s > 30) the second term is formed in log
    space, so e^ε Φ̄(z + s) never becomes inf·0. Entries with z ≥ 37.5 are 0 (below 1e-300).
    """
    eps = np.asarray(eps, dtype=np.float64).reshape(1, -1)
    s = np.asarray(s, dtype=np.float64).reshape(-1, 1)
    z = eps / s - 0.5 * s
    zs = z + s
    first = special.ndtr(-z)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        second = np.exp(eps) * special.ndtr(-zs)
    far = zs > 30.0
    if far.any():
        rows, cols = np.nonzero(far)
        second[rows, cols] = np.exp(eps[0, cols] + special.log_ndtr(-zs[rows, cols]))
    out = first - second
    out[z >= _Z_UNDERFLOW] = 0.0
    return np.clip(out, 0.0, 1.0)


def delta_subsampled(eps: np.ndarray, s: np.ndarray, q: float, direction: Direction) -> np.ndarray:
    """δ(ε) of the Poisson-subsampled Gaussian pair with sensitivity ``s`` (noise std 1).

    ``eps`` has shape (n,), ``s`` shape (m,); the result has shape (m, n).
    """
    eps = np.asarray(eps, dtype=np.float64)[None, :]
    s = np.asarray(s, dtype=np.float64)[:, None]
    log1m_q = np.log1p(-q) if q < 1.0 else -np.inf
    out = np.zeros(np.broadcast_shapes(eps.shape, s.shape))
    if direction == "remove":
        active = eps > log1m_q
        e = np.where(active, eps, 0.0)
        eps_g = log1p_expm1_over(e, q)
        val = q * delta_gaussian(eps_g[0], s[:, 0])
        below = -np.expm1(np.minimum(eps, 0.0))
        out = np.where(active, val, below)
    elif direction == "add":
        active = eps < -log1m_q
        e = np.where(active, eps, 0.0)
        u = log1p_expm1_over(-e, q)
        factor = -np.expm1(e + log1m_q)
        out = np.where(active, factor * delta_gaussian(-u[0], s[:, 0]), 0.0)
    else:  # pragma: no cover - guarded by callers
        raise ValueError(f"unknown direction {direction!r}")
    return np.clip(out, 0.0, 1.0)


def delta_infinite_sensitivity(eps: np.ndarray, q: float, direction: Direction) -> np.ndarray:
    """Limit s → ∞ of :func:`delta_subsampled` (the sampled example is revealed outright).

    remove: P puts mass q on an event of Q-probability 0, so δ(ε) = q for ε ≥ log(1 − q) and
    1 − e^ε below. add: δ(ε) = (1 − (1 − q) e^ε)_+.
    """
    eps = np.asarray(eps, dtype=np.float64)
    log1m_q = np.log1p(-q) if q < 1.0 else -np.inf
    if direction == "remove":
        return np.where(eps > log1m_q, q, -np.expm1(np.minimum(eps, 0.0)))
    return np.clip(-np.expm1(eps + log1m_q), 0.0, 1.0)


def loss_bounds(q: float, direction: Direction) -> tuple[float, float]:
    """Hard bounds of the privacy loss: remove ≥ log(1 − q), add ≤ −log(1 − q)."""
    if q >= 1.0:
        return (-np.inf, np.inf)
    if direction == "remove":
        return (float(np.log1p(-q)), np.inf)
    return (-np.inf, float(-np.log1p(-q)))


def lower_tail(t: np.ndarray, s: np.ndarray, q: float, direction: Direction) -> np.ndarray:
    """P(L < t) of the privacy loss L under P; ``t`` shape (n,), ``s`` shape (m,) → (m, n).

    remove: L < t ⇔ x < x*(t) = log(1 + (e^t − 1)/q)/s + s/2 (0 for t ≤ log(1 − q)), and
    P = (1 − q) N(0, 1) + q N(s, 1).
    add: L < t ⇔ x > u(t)/s + s/2 with u(t) = log(1 + (e^{−t} − 1)/q) (1 for t ≥ −log(1 − q)),
    and P = N(0, 1).
    """
    t = np.asarray(t, dtype=np.float64)[None, :]
    s = np.asarray(s, dtype=np.float64)[:, None]
    log1m_q = np.log1p(-q) if q < 1.0 else -np.inf
    if direction == "remove":
        active = t > log1m_q
        tt = np.where(active, t, 0.0)
        x_star = log1p_expm1_over(tt, q) / s + s / 2.0
        val = (1.0 - q) * special.ndtr(x_star) + q * special.ndtr(x_star - s)
        return np.where(active, val, 0.0)
    active = t < -log1m_q
    tt = np.where(active, t, 0.0)
    u = log1p_expm1_over(-tt, q)
    val = special.ndtr(-(u / s + s / 2.0))
    return np.where(active, val, 1.0)


def lower_tail_infinite_sensitivity(t: np.ndarray, q: float, direction: Direction) -> np.ndarray:
    """Limit s → ∞ of :func:`lower_tail` (remove: L ∈ {log(1−q), +∞}; add: L = −log(1−q))."""
    t = np.asarray(t, dtype=np.float64)
    log1m_q = np.log1p(-q) if q < 1.0 else -np.inf
    if direction == "remove":
        return np.where(t > log1m_q, 1.0 - q, 0.0)
    return np.where(t > -log1m_q, 1.0, 0.0)
