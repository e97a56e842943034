"""The one step rule: how many noisy steps a job of N examples, batch size B and E epochs runs.

The planner, the runner, the service and ``dprc accountant`` all count steps with
:func:`planned_steps`, so the number a user calibrates with is the number the job runs.
An event class says which rule its jobs follow
(:attr:`~dprc_core.accounting.events.PrivacyEvent.fixed_order`).
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction


def poisson_steps(dataset_size: int, batch_size: float, epochs: float) -> int:
    """Steps of a Poisson-sampled job: ⌈epochs·N/B⌉, computed in exact rational arithmetic
    on the numbers as written (the shortest decimal of a float: 0.1 epochs of 30 examples at
    B = 1 is 3 steps, where float arithmetic gives 3.0000000000000004 and a fourth step)."""
    return math.ceil(Fraction(str(epochs)) * dataset_size / Fraction(str(batch_size)))


def fixed_order_steps(dataset_size: int, batch_size: float, epochs: float) -> int:
    """Steps of a job of fixed-order epochs (ν-DP-FTRL): epochs·⌈N/B⌉."""
    return int(epochs) * -(-dataset_size // int(batch_size))


def planned_steps(
    dataset_size: int,
    batch_size: float,
    epochs: float,
    mechanism: str | None = None,
    *,
    fixed_order: bool = False,
) -> int:
    """Steps a job runs: :func:`poisson_steps` (Poisson sampling), or
    :func:`fixed_order_steps` with ``fixed_order`` (the ``fixed_order`` of the job's event
    class). The steps computed here are the steps that run and the steps accounted, so the
    rounding cannot make them disagree.

    ``mechanism`` (deprecated): the job's mechanism name, whose registered event class says
    whether its batches are fixed-order."""
    if mechanism is not None:
        from dprc_core.accounting.events import event_type_named

        warnings.warn(
            "planned_steps(..., mechanism) is deprecated, pass fixed_order=",
            DeprecationWarning,
            stacklevel=2,
        )
        fixed_order = event_type_named(mechanism).fixed_order
    rule = fixed_order_steps if fixed_order else poisson_steps
    return rule(dataset_size, batch_size, epochs)
