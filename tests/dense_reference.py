"""Independent dense references shared by tests (numpy / scipy, no dprc code)."""

from __future__ import annotations

import numpy as np
from scipy import special


def dense_b(nu: float, steps: int, bands: int | None) -> np.ndarray:
    """The ν-DP-FTRL noise matrix B (lower-triangular Toeplitz), built entry by entry from
    β_τ = (−1)^τ binom(1/2, τ)(1−ν)^τ, zero from ``bands`` on."""
    b = np.zeros((steps, steps))
    for i in range(steps):
        for j in range(i + 1):
            tau = i - j
            if bands is None or tau < bands:
                b[i, j] = (-1) ** tau * special.binom(0.5, tau) * (1 - nu) ** tau
    return b
