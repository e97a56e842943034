"""Privacy plan of a job: sample rate, steps, δ and the calibrated noise multiplier.

* q = batch_size / N (the expected Poisson batch size over the data set size);
* steps = ceil(epochs · N / batch_size): rounded **up**, and the accountant charges exactly the
  steps that run (a job never runs more steps than it was accounted for);
* δ defaults to 1/N^1.1 rounded **down** to two significant digits (always < 1/N); a δ
  above 1/N is refused;
* σ is the smallest noise multiplier (relative tolerance 0.5 %) whose ε at δ is at most the
  target, from :func:`dprc_core.accounting.noise_multiplier` with the default (dimension-free)
  envelope for randomized clipping, in the model of the sketch that runs (``sketch``:
  ``"shared"`` — revealed scale — or ``"per_example"`` — hidden scale, docs/accounting.md §10),
  the hidden scale on the plan's own scale law (``scale_width``, 1 % for a plan made now).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dprc_core.accounting import PrivacyEvent
from dprc_core.accounting.event_checks import check_scale_width
from dprc_core.accounting.events import (
    HIDDEN_SCALE_WIDTH,
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    check_delta,
    check_epsilon,
    check_sketch,
    default_sketch,
)
from dprc_core.accounting.steps import planned_steps
from dprc_core.noise.mechanisms import NoiseMechanism, as_noise_mechanism, mechanism_class
from dprc_core.norm_methods import ENVELOPES
from dprc_core.plan_errors import PlanError

__all__ = [
    "PRIVACY_UNITS",
    "PlanError",
    "PrivacyPlan",
    "check_delta_for_size",
    "default_delta",
    "plan_privacy",
    "planned_steps",
]


def check_delta_for_size(delta: float, n: int) -> float:
    """A valid δ that is also at most 1/N: a larger δ allows releasing whole examples."""
    try:
        delta = check_delta(delta)
    except ValueError as exc:
        raise PlanError("delta", str(exc)) from None
    if delta > 1 / n:
        raise PlanError(
            "delta",
            f"delta={delta:g} is above 1/N = {1 / n:g} for a data set of {n} examples; such a "
            "delta would allow releasing whole examples",
        )
    return delta


def default_delta(n: int) -> float:
    """1/N^1.1 rounded down to two significant digits."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise PlanError("dataset_size", f"the data set needs at least 2 examples, got {n!r}")
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
    # per-example sketches: the hidden-scale law's bin width σ was calibrated and is accounted
    # on (docs/accounting.md §10; None for every other plan). A plan keeps its law: a resumed
    # checkpoint's, a service job's stored one.
    scale_width: float | None = None

    @property
    def noise(self) -> NoiseMechanism:
        """The noise mechanism this plan runs, with its σ."""
        return mechanism_class(self.mechanism).from_plan(self)

    def event(self, steps: int | None = None) -> PrivacyEvent:
        """The privacy event of the first ``steps`` steps (default: the whole plan), built by
        the plan's mechanism (ν-DP-FTRL: the first t released steps are rows 1..t of the same
        Toeplitz noise)."""
        return self.noise.event(self, self.steps if steps is None else steps)

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
    mechanism: str | NoiseMechanism = "gaussian",
    nu: float | None = None,
    bands: int | None = None,
    sketch: str | None = None,
    unit: str = "example",
    sharding: str = "none",
    secure: bool = False,
    max_steps: int | None = None,
    scale_width: float | None = None,
) -> PrivacyPlan:
    """Plan a job; exactly one of ``target_epsilon`` / ``noise_multiplier_value`` is given.
    The one home of the plan's rules: a refusal is a :class:`PlanError` naming the field.

    ``mechanism``: a noise mechanism object (``Gaussian()``, ``NuDPFTRL(nu=0.1)``; its σ, if
    set, is used as ``noise_multiplier_value``) or its name (``nu`` / ``bands`` beside a name:
    the mechanism's own fields). The mechanism states what it allows (randomized clipping,
    user-level units, ``sharding``, ``secure`` mode), its step rule and its calibration:
    Poisson sampling — q = B/N, steps = ⌈epochs·N/B⌉ — or fixed order — integer B and epochs,
    steps = epochs·⌈N/B⌉, σ from the matrix-mechanism sensitivity with no amplification
    (docs/accounting.md §9).

    ``unit="user"``: user-level DP — ``dataset_size`` counts users and ``batch_size`` the
    expected users a step; q, steps, δ (≤ 1/N_users) and σ follow exactly as for examples
    (docs/privacy_unit.md).

    ``clipping``: the accountant's envelope (``exact``, ``hutch``, ``hutchpp``); ``k``: its
    projection dimension (≥ 2 for a randomized envelope). ``sketch``: how the engine draws
    randomized clipping's projections (``"shared"`` or ``"per_example"``, the accountant's
    model for it; refused with exact clipping). ``None``: the engine's default, per-example for
    randomized clipping and shared for exact (:func:`dprc_core.accounting.events.default_sketch`).

    ``max_steps``: the most steps a caller runs (a plan beyond it is refused naming
    ``epochs``). ``scale_width``: per-example sketches only, the hidden-scale law σ is
    calibrated and accounted on (None: the current law,
    :data:`~dprc_core.accounting.events.HIDDEN_SCALE_WIDTH`; a resumed job or a stored service
    job passes the law it was planned on)."""
    noise = _noise(mechanism, nu, bands)
    if noise.noise_multiplier is not None:
        if noise_multiplier_value is not None:
            raise PlanError("noise_multiplier", "σ given twice: in the mechanism and beside it")
        noise_multiplier_value = noise.noise_multiplier
    if unit not in PRIVACY_UNITS:
        raise PlanError("unit", f"unit must be one of {PRIVACY_UNITS}, got {unit!r}")
    if clipping not in ENVELOPES:
        raise PlanError("clipping", f"clipping must be one of {ENVELOPES}, got {clipping!r}")
    randomized = clipping != "exact"
    noise.check_options(
        randomized=randomized, sketch=sketch, unit=unit, sharding=sharding, secure=secure
    )
    n = dataset_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise PlanError("dataset_size", f"the data set needs at least 2 examples, got {n!r}")
    noise.check_schedule(n, batch_size, epochs)
    if (target_epsilon is None) == (noise_multiplier_value is None):
        raise PlanError("target_epsilon", "give exactly one of target_epsilon and noise_multiplier")
    delta = default_delta(n) if delta is None else check_delta_for_size(delta, n)
    steps = noise.steps(n, batch_size, epochs)
    if max_steps is not None and steps > max_steps:
        raise PlanError("epochs", f"this job would run {steps} steps (at most {max_steps})")
    k_acc = _check_k(k) if randomized else None
    sketch = _check_sketch(sketch, clipping)
    scale_width = _check_scale_width(scale_width, sketch)
    draft = PrivacyPlan(
        n,
        float(batch_size),
        float(epochs),
        batch_size / n,
        steps,
        delta,
        0.0,
        clipping,
        k_acc,
        None,
        math.nan,
        noise.name,
        sketch=sketch,
        unit=unit,
        scale_width=scale_width,
        **noise.plan_fields(n, batch_size, epochs),
    )
    if noise_multiplier_value is None:
        try:
            target = check_epsilon(target_epsilon)
        except ValueError as exc:
            raise PlanError("target_epsilon", str(exc)) from None
        sigma = noise.calibrate(target, delta, draft)
    else:
        sigma, target = _check_sigma(noise_multiplier_value), None
    sized = _replace(draft, noise_multiplier=sigma, target_epsilon=target)
    return _replace(sized, planned_epsilon=noise.epsilon(delta, sized))


def _noise(mechanism: str | NoiseMechanism, nu: float | None, bands: int | None) -> NoiseMechanism:
    if isinstance(mechanism, NoiseMechanism):
        if nu is not None or bands is not None:
            raise PlanError("nu", "give nu and bands inside the mechanism object, not beside it")
        return mechanism
    return as_noise_mechanism(mechanism, nu, bands, warn=False)


def _check_k(k: int | None) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise PlanError(
            "k",
            f"k must be an integer >= 2 for randomized clipping (the envelope needs chi2(k) "
            f"log-concave), got {k!r}",
        )
    return k


def _check_sketch(sketch: str | None, envelope: str) -> str:
    if sketch is None:
        return default_sketch(randomized=envelope != "exact")
    try:
        return check_sketch(sketch, envelope)
    except ValueError as exc:
        raise PlanError("sketch", str(exc)) from None


def _check_scale_width(width: float | None, sketch: str) -> float | None:
    """The plan's hidden-scale law: per-example sketches only (None: the current law)."""
    if sketch != PER_EXAMPLE_SKETCH:
        if width is not None:
            raise PlanError(
                "scale_width",
                "scale_width applies to per-example sketches (the hidden-scale model) only, "
                f"the plan's sketch is {sketch!r}",
            )
        return None
    try:
        return check_scale_width(HIDDEN_SCALE_WIDTH if width is None else width)
    except ValueError as exc:
        raise PlanError("scale_width", str(exc)) from None


def _check_sigma(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value >= 0):
        raise PlanError(
            "noise_multiplier", f"noise_multiplier must be a finite number >= 0, got {value!r}"
        )
    return float(value)


def _replace(plan: PrivacyPlan, **changes: Any) -> PrivacyPlan:
    from dataclasses import replace

    return replace(plan, **changes)
