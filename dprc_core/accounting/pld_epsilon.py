"""ε for a target δ from a (composed) dense PLD PMF, vectorised.

For a PMF with masses p_i at losses L_i = (i0 + i)·h and mass p_∞ at +∞,
``δ(ε) = p_∞ + Σ_{L_i > ε} p_i (1 − e^{ε − L_i})``. At the grid point L_i it equals
``p_∞ + S_{i+1} − R_i`` with ``S_i = Σ_{j≥i} p_j`` and ``R_i = Σ_{j>i} p_j e^{−(j−i)h}``; R obeys
``R_i = e^{−h}(p_{i+1} + R_{i+1})``, a stable first-order recursion (``scipy.signal.lfilter``).
Between grid points the equation δ(ε) = δ* is solved in closed form. Same result as
``dp_accounting``'s ``get_epsilon_for_delta`` without its Python loop.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import signal

from dprc_core.accounting.memory import note_temporaries


def _epsilon_dense(pmf: pld_pmf.DensePLDPmf, delta: float) -> float:
    # pylint: disable=protected-access
    probs = np.maximum(np.asarray(pmf._probs, dtype=np.float64), 0.0)
    # a dozen temporaries of the PMF's size below (a cached composition read again runs no
    # transform): freed pages that the caller's trim gives back
    note_temporaries(probs.size)
    inf_mass = float(pmf._infinity_mass)
    lower = int(pmf._lower_loss)
    h = float(pmf._discretization)
    if inf_mass > delta:
        return math.inf
    losses_idx = lower + np.arange(probs.size)
    keep = losses_idx >= 0  # only ε ≥ 0 is reported; losses ≤ 0 never enter δ(ε ≥ 0)
    if not keep.any():
        return 0.0
    p = probs[keep]
    first = int(losses_idx[keep][0])
    r = math.exp(-h)
    # R_i for i over p (index 0 = loss first*h); computed on the reversed array.
    rev = p[::-1]
    r_rev = signal.lfilter([0.0, r], [1.0, -r], rev)
    big_r = r_rev[::-1]
    tail_sum = np.concatenate([np.cumsum(rev)[::-1][1:], [0.0]])  # S_{i+1}
    delta_at = inf_mass + tail_sum - big_r  # δ at ε = L_i
    # δ at ε = 0 (just below the first non-negative loss when first > 0)
    if first > 0:
        d0 = inf_mass + float(np.sum(p * -np.expm1(-(first + np.arange(p.size)) * h)))
    else:
        d0 = float(delta_at[0]) if p.size else inf_mass
    if d0 <= delta:
        return 0.0
    ok = np.nonzero(delta_at <= delta)[0]
    if ok.size == 0:  # pragma: no cover - the last grid point has δ = p_∞ ≤ delta
        return math.inf
    i = int(ok[0])
    # ε in [L_{i-1}, L_i] (or [0, L_0] when i = 0): δ(ε) = p_∞ + S_i − e^{ε − L_i}(p_i + R_i)
    s_i = inf_mass + tail_sum[i] + p[i]
    m_i = p[i] + big_r[i]
    li = (first + i) * h
    if m_i <= 0:
        return max(li, 0.0)
    eps = li + math.log((s_i - delta) / m_i) if s_i > delta else li
    lower_edge = (first + i - 1) * h if i > 0 else 0.0
    return float(min(max(eps, lower_edge, 0.0), li))


def epsilon_from_pld(pld: PrivacyLossDistribution, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta, maximised over both adjacency directions."""
    # pylint: disable=protected-access
    pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
    return max(_epsilon_dense(p.to_dense_pmf(), delta) for p in pmfs)
