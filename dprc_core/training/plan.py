"""Privacy plan of a job: sample rate, steps, δ and the calibrated noise multiplier.

* q = batch_size / N (the expected Poisson batch size over the data set size);
* steps = ceil(epochs · N / batch_size): rounded **up**, and the accountant charges exactly the
  steps that run (a job never runs more steps than it was accounted for);
* δ defaults to 1/N^1.1 rounded **down** to two significant digits (always < 1/N); a δ
  above 1/N is refused;
* σ is the smallest noise multiplier (relative tolerance 0.5 %) whose ε at δ is at most the
  target, from :func:`dprc_core.accounting.noise_multiplier` with the default (dimension-free)
  envelope for randomized clipping, in the model of the sketch that runs (``sketch``:
  ``"shared"`` — revealed scale — or ``"per_example"`` — hidden scale, docs/accounting.md §10).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dprc_core.accounting import PrivacyEvent, SubsampledGaussianEvent, noise_multiplier
from dprc_core.accounting.calibration import gaussian_epsilon
from dprc_core.accounting.dpftrl import dpftrl_epsilon, dpftrl_noise_multiplier
from dprc_core.accounting.events import (
    SHARED_SKETCH,
    NuDPFTRLEvent,
    check_delta,
    check_epsilon,
    default_sketch,
)
from dprc_core.accounting.steps import planned_steps

NOISE_MECHANISMS = ("gaussian", "nu_dpftrl")


def check_delta_for_size(delta: float, n: int) -> float:
    """A valid δ that is also at most 1/N: a larger δ allows releasing whole examples."""
    delta = check_delta(delta)
    if delta > 1 / n:
        raise ValueError(
            f"delta={delta:g} is above 1/N = {1 / n:g} for a data set of {n} examples; such a "
            "delta would allow releasing whole examples"
        )
    return delta


def default_delta(n: int) -> float:
    """1/N^1.1 rounded down to two significant digits."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"the data set needs at least 2 examples, got {n!r}")
    exact = n**-1.1
    exponent = math.floor(math.log10(exact))
    mantissa = math.floor(exact / 10**exponent * 10) / 10
    value = float(f"{mantissa:.1f}e{exponent}")
    while value > exact:  # floating-point guard: never above 1/N^1.1
        value = math.nextafter(value, 0.0)
    return value


PRIVACY_UNITS = ("example", "user")


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
    mechanism: str = "gaussian"  # gaussian (Poisson DP-SGD) | nu_dpftrl (fixed order)
    nu: float | None = None
    bands: int | None = None
    min_separation: int | None = None  # nu_dpftrl: steps per epoch
    sketch: str = SHARED_SKETCH  # randomized clipping: shared | per_example projections
    # the privacy unit: "example" (a line), or "user" (all of a person's lines: dataset_size
    # is then the number of users, batch_size the expected users a step; docs/privacy_unit.md)
    unit: str = "example"

    def event(self, steps: int | None = None) -> PrivacyEvent:
        """The privacy event of the first ``steps`` steps (default: the whole plan).

        ν-DP-FTRL: the first t released steps are rows 1..t of the same lower-triangular
        Toeplitz noise, i.e. a ν-DP-FTRL run of t steps with at most ⌈t/s⌉ participations."""
        steps = self.steps if steps is None else steps
        if self.mechanism == "nu_dpftrl":
            assert self.nu is not None and self.min_separation is not None
            return NuDPFTRLEvent.prefix(
                self.noise_multiplier, steps, self.nu, self.min_separation, self.bands
            )
        return SubsampledGaussianEvent(
            self.noise_multiplier,
            self.sample_rate,
            steps,
            self.clipping,
            self.k,
            sketch=self.sketch,
        )

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
    mechanism: str = "gaussian",
    nu: float | None = None,
    bands: int | None = None,
    sketch: str | None = None,
    unit: str = "example",
) -> PrivacyPlan:
    """Plan a job; exactly one of ``target_epsilon`` / ``noise_multiplier_value`` is given.

    ``unit="user"``: user-level DP — ``dataset_size`` counts users and ``batch_size`` the
    expected users a step; q, steps, δ (≤ 1/N_users) and σ follow exactly as for examples
    (docs/privacy_unit.md).

    ``sketch``: how the engine draws randomized clipping's projections (``"shared"`` or
    ``"per_example"``, the accountant's model for it; refused with exact clipping). ``None``:
    the engine's default, per-example for randomized clipping and shared for exact
    (:func:`dprc_core.accounting.events.default_sketch`).

    ``mechanism="nu_dpftrl"``: fixed-order batches (integer ``batch_size`` and ``epochs``),
    steps = epochs·⌈N/B⌉, exact clipping only, σ from the matrix-mechanism sensitivity with no
    amplification (docs/accounting.md §9)."""
    if mechanism not in NOISE_MECHANISMS:
        raise ValueError(f"noise mechanism must be one of {NOISE_MECHANISMS}, got {mechanism!r}")
    if unit not in PRIVACY_UNITS:
        raise ValueError(f"unit must be one of {PRIVACY_UNITS}, got {unit!r}")
    if mechanism == "nu_dpftrl" and unit != "example":
        raise ValueError(
            "nu_dpftrl is accounted per example (fixed-order batches of lines); user-level DP "
            "takes the gaussian mechanism"
        )
    if mechanism == "nu_dpftrl":
        if sketch not in (None, SHARED_SKETCH):
            raise ValueError("sketch applies to randomized clipping, which nu_dpftrl refuses")
        return _plan_nu_dpftrl(
            dataset_size,
            batch_size,
            epochs,
            clipping,
            target_epsilon,
            delta,
            noise_multiplier_value,
            nu,
            bands,
        )
    if nu is not None or bands is not None:
        raise ValueError("nu and bands apply to the nu_dpftrl mechanism only")
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
    delta = default_delta(n) if delta is None else check_delta_for_size(delta, n)
    q = batch_size / n
    steps = planned_steps(n, batch_size, epochs)
    k_acc = k if clipping != "exact" else None
    if sketch is None:
        sketch = default_sketch(randomized=clipping != "exact")
    SubsampledGaussianEvent(1.0, q, steps, clipping, k_acc, sketch=sketch)  # validates them
    if noise_multiplier_value is None:
        target = check_epsilon(target_epsilon)
        sigma = noise_multiplier(target, delta, q, steps, clipping, k_acc, sketch=sketch)
    else:
        sigma = float(noise_multiplier_value)
        target = None
    event = SubsampledGaussianEvent(sigma, q, steps, clipping, k_acc, sketch=sketch)
    planned = gaussian_epsilon(event, delta)  # the calibration's own composition of σ
    return PrivacyPlan(
        n,
        float(batch_size),
        float(epochs),
        q,
        steps,
        delta,
        sigma,
        clipping,
        k_acc,
        target,
        planned,
        sketch=sketch,
        unit=unit,
    )


def _plan_nu_dpftrl(
    n, batch_size, epochs, clipping, target_epsilon, delta, sigma_given, nu, bands
) -> PrivacyPlan:
    if clipping != "exact":
        raise ValueError(
            f"clipping {clipping!r} with nu_dpftrl is refused: randomized clipping with "
            "correlated noise has no privacy analysis; use exact norms"
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"the data set needs at least 2 examples, got {n!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 0 < batch_size <= n:
        raise ValueError(f"nu_dpftrl needs an integer batch_size in [1, N={n}], got {batch_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or not 0 < epochs <= 10_000:
        raise ValueError(f"nu_dpftrl needs an integer number of epochs >= 1, got {epochs!r}")
    if nu is None:
        raise ValueError("nu_dpftrl needs nu (the damping, in [0, 1])")
    if (target_epsilon is None) == (sigma_given is None):
        raise ValueError("give exactly one of target_epsilon and noise_multiplier")
    delta = default_delta(n) if delta is None else check_delta_for_size(delta, n)
    sep = -(-n // batch_size)
    steps = planned_steps(n, batch_size, epochs, fixed_order=True)
    if sigma_given is None:
        target = check_epsilon(target_epsilon)
        sigma = dpftrl_noise_multiplier(target, delta, nu, steps, epochs, sep, bands=bands)
    else:
        sigma, target = float(sigma_given), None
    planned = dpftrl_epsilon(sigma, delta, nu, steps, epochs, sep, bands=bands)
    return PrivacyPlan(
        n,
        float(batch_size),
        float(epochs),
        batch_size / n,
        steps,
        delta,
        sigma,
        "exact",
        None,
        target,
        planned,
        "nu_dpftrl",
        float(nu),
        bands,
        sep,
    )
