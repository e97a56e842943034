"""Privacy plan of a job: sample rate, steps, δ and the calibrated noise multiplier.

* q = batch_size / N (the expected Poisson batch size over the data set size);
* steps = ceil(epochs · N / batch_size): rounded **up**, and the accountant charges exactly the
  steps that run (a job never runs more steps than it was accounted for);
* δ defaults to 1/N^1.1 rounded **down** to two significant digits (always < 1/N);
* σ is the smallest noise multiplier (relative tolerance 0.5 %) whose ε at δ is at most the
  target, from :func:`dprc_core.accounting.noise_multiplier` with the default (dimension-free)
  envelope for randomized clipping.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dprc_core.accounting import PrivacyEvent, epsilon_for_events, noise_multiplier
from dprc_core.accounting.events import check_delta, check_epsilon


def default_delta(n: int) -> float:
    """1/N^1.1 rounded down to two significant digits."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"the data set needs at least 2 examples, got {n!r}")
    exact = n ** -1.1
    exponent = math.floor(math.log10(exact))
    mantissa = math.floor(exact / 10**exponent * 10) / 10
    value = mantissa * 10**exponent
    while value > exact:  # floating-point guard: never above 1/N^1.1
        value = math.nextafter(value, 0.0)
    return value


@dataclass(frozen=True)
class PrivacyPlan:
    dataset_size: int
    batch_size: float
    epochs: float
    sample_rate: float
    steps: int
    delta: float
    noise_multiplier: float
    clipping: str  # accountant's clipping: exact | hutch | hutchpp
    k: int | None
    target_epsilon: float | None
    planned_epsilon: float

    def event(self, steps: int | None = None) -> PrivacyEvent:
        return PrivacyEvent(self.noise_multiplier, self.sample_rate,
                            self.steps if steps is None else steps, self.clipping, self.k)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_privacy(
    *,
    dataset_size: int,
    batch_size: float,
    epochs: float,
    clipping: str,
    k: int | None,
    target_epsilon: float | None = None,
    delta: float | None = None,
    noise_multiplier_value: float | None = None,
) -> PrivacyPlan:
    """Plan a job; exactly one of ``target_epsilon`` / ``noise_multiplier_value`` is given."""
    n = dataset_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"the data set needs at least 2 examples, got {n!r}")
    ok_b = isinstance(batch_size, (int, float)) and not isinstance(batch_size, bool)
    if not ok_b or not math.isfinite(batch_size) or not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in (0, N={n}], got {batch_size!r}")
    ok_e = isinstance(epochs, (int, float)) and not isinstance(epochs, bool)
    if not ok_e or not math.isfinite(epochs) or not 0 < epochs <= 10_000:
        raise ValueError(f"epochs must be a number in (0, 10000], got {epochs!r}")
    if (target_epsilon is None) == (noise_multiplier_value is None):
        raise ValueError("give exactly one of target_epsilon and noise_multiplier")
    delta = default_delta(n) if delta is None else check_delta(delta)
    q = batch_size / n
    steps = math.ceil(epochs * n / batch_size)
    k_acc = k if clipping != "exact" else None
    if noise_multiplier_value is None:
        target = check_epsilon(target_epsilon)
        sigma = noise_multiplier(target, delta, q, steps, clipping, k_acc)
    else:
        sigma = float(noise_multiplier_value)
        target = None
    planned = epsilon_for_events([PrivacyEvent(sigma, q, steps, clipping, k_acc)], delta)
    return PrivacyPlan(n, float(batch_size), float(epochs), q, steps, delta, sigma, clipping,
                       k_acc, target, planned)
