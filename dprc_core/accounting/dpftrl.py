"""Privacy of ν-DP-FTRL: sensitivity of the implemented noise matrix and the Gaussian mechanism.

The trainer adds z_t = Σ_{τ≤t} β_τ w_{t−τ} to the clipped gradient sum of step t, with
w ~ N(0, σ²C² I) and β_τ = (−1)^τ binom(1/2, τ)(1−ν)^τ (only β_0 … β_{bands−1} when banded).
Stacking the steps, the released noisy gradients are G + B W = B (B⁻¹G + W) with B the
lower-triangular Toeplitz matrix of β: a post-processing of the Gaussian mechanism B⁻¹G + W.
Under zero-out adjacency (one example's clipped gradients replaced by zero, the batch positions
unchanged — see docs/accounting.md §9) the difference of B⁻¹G is Σ_{t∈P} (B⁻¹)_{:,t} ⊗ Δg_t over
the steps P in which the example participates, ‖Δg_t‖ ≤ C. Its largest norm is

    C · max_P sqrt(Σ_{s,t∈P} X_st),   X = (B⁻¹)ᵀ B⁻¹,

when X ≥ 0 on the pattern (aligned Δg_t attain it; ⟨Δg_s, Δg_t⟩ ≤ C² bounds every term). For a
general X, sqrt(Σ |X_st|) is an upper bound. Here B⁻¹ is Toeplitz with coefficients c_t ≥ 0
(the inverse series of β; β_τ ≤ 0 for τ ≥ 1 makes every c_t ≥ 0, banded or not), so X ≥ 0.

The sensitivity is in units of C, so one whole run is a Gaussian mechanism with μ = Δ/σ; ε at
δ is the analytic Gaussian (Balle & Wang 2018) δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ).
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import signal, special

from dprc_core.accounting.renamed_keywords import renamed_keyword

# Relative inflation of every computed sensitivity: covers float64 round-off of the O(T·k)
# sums (≤ 1e-11 relative for T·k ≤ 1e5), so the value returned stays an upper bound.
ROUNDOFF_MARGIN = 1e-9
# Exhaustive search over participation patterns is used up to this many patterns and steps
# (the Gram matrix it builds is steps × steps).
MAX_EXHAUSTIVE_PATTERNS = 200_000
MAX_EXHAUSTIVE_STEPS = 2_000
MU_MIN = 1e-8
MU_MAX = 1e4


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_nu(nu: Any) -> float:
    if not _is_real(nu) or not math.isfinite(nu) or not 0 <= nu <= 1:
        raise ValueError(f"nu must be a number in [0, 1], got {nu!r}")
    return float(nu)


def check_bands(bands: Any) -> int | None:
    if bands is None:
        return None
    if not _is_int(bands) or bands < 1:
        raise ValueError(f"bands must be None (un-banded) or an integer >= 1, got {bands!r}")
    return int(bands)


def _check_positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def nu_dpftrl_coefficients(nu: float, n: int, bands: int | None = None) -> np.ndarray:
    """β_0 … β_{n−1} of the implemented noise: (−1)^τ binom(1/2, τ)(1−ν)^τ, zero from
    ``bands`` on. Recursion β_τ = β_{τ−1}·(τ − 3/2)/τ·(1−ν), β_0 = 1."""
    nu = check_nu(nu)
    n = _check_positive_int("n", n)
    bands = check_bands(bands)
    tau = np.arange(1, n, dtype=np.float64)
    ratios = (tau - 1.5) / tau * (1.0 - nu)
    beta = np.concatenate([[1.0], np.cumprod(ratios)])
    if bands is not None:
        beta[bands:] = 0.0
    return beta


def inverse_coefficients(nu: float, n: int, bands: int | None = None) -> np.ndarray:
    """c_0 … c_{n−1}: the first column of B⁻¹ (B lower-triangular Toeplitz of β).

    Un-banded: β has generating function (1 − (1−ν)x)^{1/2}, so B⁻¹ has (1 − (1−ν)x)^{−1/2},
    c_t = binom(2t, t)/4^t (1−ν)^t (recursion c_t = c_{t−1}·(2t−1)/(2t)·(1−ν)).
    Banded: c solves Σ_{τ<bands} β_τ c_{t−τ} = [t = 0] (``scipy.signal.lfilter``); since
    β_0 = 1 and β_τ ≤ 0 for τ ≥ 1, c_t = Σ |β_τ| c_{t−τ} ≥ 0.
    """
    nu = check_nu(nu)
    n = _check_positive_int("n", n)
    bands = check_bands(bands)
    if bands is None or bands >= n:
        t = np.arange(1, n, dtype=np.float64)
        return np.concatenate([[1.0], np.cumprod((2 * t - 1) / (2 * t) * (1.0 - nu))])
    beta = nu_dpftrl_coefficients(nu, bands)
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return signal.lfilter([1.0], beta, impulse)


def max_participations(steps: int, participations: int, min_separation: int) -> int:
    """Largest number of participations that fit: min(k, ⌊(T−1)/b⌋ + 1)."""
    return min(participations, (steps - 1) // min_separation + 1)


def _earliest_pattern_norm(c: np.ndarray, k: int, b: int) -> float:
    """‖Σ_{l<k} (column l·b of the Toeplitz matrix of c)‖."""
    n = c.size
    v = np.zeros(n)
    for l in range(k):
        start = l * b
        if start >= n:
            break
        v[start:] += c[: n - start]
    return float(np.sqrt(np.dot(v, v)))


def _gram(c: np.ndarray) -> np.ndarray:
    n = c.size
    inv = np.zeros((n, n))
    for j in range(n):
        inv[j:, j] = c[: n - j]
    return inv.T @ inv


def _count_patterns(n: int, k: int, b: int, cap: int) -> int:
    """Number of non-empty patterns of ≤ k steps in [0, n) with gaps ≥ b (capped at ``cap``)."""
    total = 0
    for j in range(1, k + 1):
        free = n - (j - 1) * (b - 1)
        if free < j:
            break
        total += math.comb(free, j)
        if total > cap:
            return cap + 1
    return total


def _exhaustive(c: np.ndarray, k: int, b: int) -> float:
    """max over patterns of sqrt(Σ_{s,t∈P} |X_st|), by depth-first search over patterns that
    cannot be extended to the right (with |X| ≥ 0, a superset never has a smaller value)."""
    gram = np.abs(_gram(c))
    n = c.size
    best = 0.0

    def dfs(pattern: list[int], value: float) -> None:
        nonlocal best
        nxt = pattern[-1] + b if pattern else 0
        if len(pattern) == k or nxt >= n:
            best = max(best, value)
            return
        for p in range(nxt, n):
            add = gram[p, p] + 2.0 * sum(gram[p, q] for q in pattern)
            pattern.append(p)
            dfs(pattern, value + add)
            pattern.pop()

    dfs([], 0.0)
    return math.sqrt(best)


@dataclass(frozen=True)
class SensitivityResult:
    """``value``: the sensitivity to use (an upper bound, exact up to ``ROUNDOFF_MARGIN``
    when ``exact``); ``earliest``: the norm at the pattern 0, b, 2b, … (always attained, so a
    lower bound); ``method``: how the maximum was found."""

    value: float
    exact: bool
    method: str
    earliest: float


def toeplitz_sensitivity(
    c: np.ndarray, participations: int, min_separation: int
) -> SensitivityResult:
    """Sensitivity (units of C) of the Toeplitz lower-triangular matrix with first column ``c``
    (the coefficients of B⁻¹), over patterns of at most ``participations`` steps in [0, len(c))
    separated by at least ``min_separation`` steps.

    * c non-negative and non-increasing (checked, not assumed): the Gram entries
      X_ij = Σ_{m ≤ T−1−max(i,j)} c_m c_{m+|i−j|} are ≥ 0, non-increasing in |i−j| and in
      max(i, j); the pattern q_l = l·b has |q_i − q_j| ≤ |p_i − p_j| and max(q_i, q_j) ≤
      max(p_i, p_j) for any allowed p, so it maximises every term: **exact**.
    * one participation: the first column (column j is a prefix of c), **exact**.
    * otherwise, few patterns and steps: exhaustive maximum of sqrt(Σ |X_st|): exact when
      X ≥ 0 (it is for c ≥ 0), an upper bound otherwise.
    * otherwise: the earliest-pattern norm of ĉ_t = max_{s≥t} |c_s|, a non-negative
      non-increasing majorant of |c|, so |X| ≤ X̂ entrywise: a sound **upper bound**.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or not np.all(np.isfinite(c)):
        raise ValueError("inverse coefficients must be a non-empty finite 1-D array")
    k = _check_positive_int("participations", participations)
    b = _check_positive_int("min_separation", min_separation)
    n = c.size
    k = max_participations(n, k, b)
    earliest = _earliest_pattern_norm(c, k, b)
    margin = 1.0 + ROUNDOFF_MARGIN
    if np.all(c >= 0) and np.all(np.diff(c) <= 0):
        return SensitivityResult(earliest * margin, True, "monotone: earliest pattern", earliest)
    if k == 1:  # column j is c[: n − j]: the first column has the largest norm, whatever c is
        return SensitivityResult(
            earliest * margin, True, "one participation: first column", earliest
        )
    if n <= MAX_EXHAUSTIVE_STEPS and (
        _count_patterns(n, k, b, MAX_EXHAUSTIVE_PATTERNS) <= MAX_EXHAUSTIVE_PATTERNS
    ):
        value = _exhaustive(c, k, b)
        exact = bool(np.all(c >= 0))
        return SensitivityResult(value * margin, exact, "exhaustive over patterns", earliest)
    majorant = np.maximum.accumulate(np.abs(c)[::-1])[::-1]
    value = _earliest_pattern_norm(majorant, k, b)
    return SensitivityResult(
        value * margin, False, "upper bound: non-increasing majorant of |c|", earliest
    )


@functools.lru_cache(maxsize=256)
def _sensitivity_cached(
    nu: float, steps: int, participations: int, min_separation: int, bands: int | None
) -> SensitivityResult:
    c = inverse_coefficients(nu, steps, bands)
    return toeplitz_sensitivity(c, participations, min_separation)


def dpftrl_sensitivity_details(
    nu: float,
    steps: int,
    participations: int,
    min_separation: int,
    bands: int | None = None,
) -> SensitivityResult:
    """:func:`dpftrl_sensitivity` with how it was obtained (see :class:`SensitivityResult`)."""
    return _sensitivity_cached(
        check_nu(nu),
        _check_positive_int("steps", steps),
        _check_positive_int("participations", participations),
        _check_positive_int("min_separation", min_separation),
        check_bands(bands),
    )


def dpftrl_sensitivity(
    nu: float,
    steps: int,
    participations: int,
    min_separation: int,
    bands: int | None = None,
) -> float:
    """L2 sensitivity (in units of the clipping norm C) of ν-DP-FTRL as implemented by
    :class:`dprc_core.noise.NuDPFTRLNoise` with the same ``nu`` and ``bands``, over ``steps``
    steps, for an example that participates in at most ``participations`` steps, any two at
    least ``min_separation`` steps apart (the :class:`~dprc_core.training.sampling.
    FixedOrderSampler` gives participations = epochs, min_separation = steps per epoch).

    Un-banded and for every banding tried, B⁻¹ has non-negative non-increasing coefficients
    and the value is exact (the maximum sits at steps 0, b, 2b, …); the monotonicity is checked
    numerically every time, and when it fails an exhaustive search or a sound upper bound is
    used instead (:func:`toeplitz_sensitivity`).
    """
    return dpftrl_sensitivity_details(nu, steps, participations, min_separation, bands).value


# --------------------------------------------------------------------------------------------
# The Gaussian mechanism, exactly (analytic Gaussian).


def check_mu(mu: Any) -> float:
    if not _is_real(mu) or not math.isfinite(mu) or mu <= 0:
        raise ValueError(f"mu must be a finite number > 0, got {mu!r}")
    return float(mu)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of the Gaussian mechanism with sensitivity/σ = μ (both adjacency directions):
    Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), evaluated in log space."""
    mu = check_mu(mu)
    if not _is_real(epsilon) or math.isnan(epsilon):
        raise ValueError(f"epsilon must be a number, got {epsilon!r}")
    if epsilon == math.inf:
        return 0.0
    a = mu / 2.0 - epsilon / mu
    log_first = float(special.log_ndtr(a))
    log_second = epsilon + float(special.log_ndtr(-mu / 2.0 - epsilon / mu))
    if log_second >= log_first:
        return 0.0
    return float(-math.exp(log_first) * math.expm1(log_second - log_first))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε; μ) ≤ ``delta`` (bisection to 1e-12 relative, rounded up)."""
    mu = check_mu(mu)
    if not _is_real(delta) or not math.isfinite(delta) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu)
    for _ in range(200):  # δ(ε) ≤ Φ(μ/2 − ε/μ) → 0: a bracket within 200 doublings
        if gaussian_delta(hi, mu) <= delta:
            break
        lo, hi = hi, 2.0 * hi
    else:  # pragma: no cover - unreachable for finite μ
        raise RuntimeError("could not bracket epsilon")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(mid, mu) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def gaussian_mu(epsilon: float, delta: float) -> float:
    """Largest μ (to 1e-12 relative, rounded down) with δ(ε; μ) ≤ ``delta``; δ increases with
    μ. Bounded bisection on log μ over [MU_MIN, MU_MAX]."""
    if not _is_real(epsilon) or not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    if not _is_real(delta) or not math.isfinite(delta) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if gaussian_delta(epsilon, MU_MIN) > delta:
        raise ValueError(f"no mu >= {MU_MIN:g} reaches epsilon={epsilon:g} at delta={delta:g}")
    if gaussian_delta(epsilon, MU_MAX) <= delta:
        return MU_MAX
    lo, hi = math.log(MU_MIN), math.log(MU_MAX)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(epsilon, math.exp(mid)) <= delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12:
            break
    return math.exp(lo)


# --------------------------------------------------------------------------------------------
# Public ε / σ for one ν-DP-FTRL run.


def check_dpftrl_envelope(envelope: Any) -> str:
    """ν-DP-FTRL is accounted for exact norms only."""
    if envelope != "exact":
        raise ValueError(
            f"nu_dpftrl needs exact per-sample clipping, got clipping={envelope!r}: randomized "
            "clipping (hutch/hutchpp) with correlated noise has no privacy analysis"
        )
    return "exact"


check_dpftrl_clipping = check_dpftrl_envelope  # the same check under its earlier name


@renamed_keyword("clipping", "envelope")
def dpftrl_epsilon(
    noise_multiplier: float,
    delta: float,
    nu: float,
    steps: int,
    participations: int,
    min_separation: int,
    bands: int | None = None,
    envelope: str = "exact",
    *,
    clipping: str | None = None,
) -> float:
    """ε at ``delta`` of one ν-DP-FTRL run (noise std σ·C per step before correlation): the
    Gaussian mechanism with μ = sensitivity/σ, exactly. No amplification by sampling.
    ``envelope`` must be ``"exact"`` (``clipping``: its deprecated name)."""
    check_dpftrl_envelope(envelope)
    sigma = float(noise_multiplier) if _is_real(noise_multiplier) else noise_multiplier
    if not _is_real(sigma) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier!r}")
    sens = dpftrl_sensitivity(nu, steps, participations, min_separation, bands)
    return gaussian_epsilon(sens / sigma, delta)


@renamed_keyword("clipping", "envelope")
def dpftrl_noise_multiplier(
    target_epsilon: float,
    target_delta: float,
    nu: float,
    steps: int,
    participations: int,
    min_separation: int,
    bands: int | None = None,
    envelope: str = "exact",
    *,
    clipping: str | None = None,
) -> float:
    """Smallest σ (to 1e-12 relative, rounded up) with ``dpftrl_epsilon(σ, …) ≤ target``;
    ``envelope`` must be ``"exact"`` (``clipping``: its deprecated name)."""
    check_dpftrl_envelope(envelope)
    sens = dpftrl_sensitivity(nu, steps, participations, min_separation, bands)
    mu = gaussian_mu(target_epsilon, target_delta)
    sigma = sens / mu * (1.0 + 1e-11)
    return sigma


__all__ = [
    "SensitivityResult",
    "dpftrl_epsilon",
    "dpftrl_noise_multiplier",
    "dpftrl_sensitivity",
    "dpftrl_sensitivity_details",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "inverse_coefficients",
    "max_participations",
    "nu_dpftrl_coefficients",
    "toeplitz_sensitivity",
]
