"""The one step rule: how many noisy steps a job of N examples, batch size B and E epochs runs.

The planner, the runner, the service and ``dprc accountant`` all count steps with
:func:`planned_steps`, so the number a user calibrates with is the number the job runs.
"""

from __future__ import annotations

import math
from fractions import Fraction


def planned_steps(
    dataset_size: int, batch_size: float, epochs: float, mechanism: str = "gaussian"
) -> int:
    """Steps a job runs: ⌈epochs·N/B⌉ (Poisson sampling), or epochs·⌈N/B⌉ for fixed-order
    ν-DP-FTRL epochs. Computed in exact rational arithmetic on the numbers as written (the
    shortest decimal of a float: 0.1 epochs of 30 examples at B = 1 is 3 steps, where float
    arithmetic gives 3.0000000000000004 and a fourth step). The steps computed here are the
    steps that run and the steps accounted, so the rounding cannot make them disagree."""
    if mechanism == "nu_dpftrl":
        return int(epochs) * -(-dataset_size // int(batch_size))
    return math.ceil(Fraction(str(epochs)) * dataset_size / Fraction(str(batch_size)))
