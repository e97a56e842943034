"""Noise mechanisms as objects: what the engine is told to add, the sampler that adds it, and
everything a plan needs to know about it.

``PrivacyEngine(..., noise=Gaussian(σ))`` adds independent N(0, σ²C²) per coordinate once per
logical batch (``Gaussian(σ, secure=True)``: from a ChaCha20 keystream, docs/engine.md "Secure
mode"); ``noise=NuDPFTRL(σ, nu=0.1, bands=16)`` adds ν-DP-FTRL correlated noise (exact
clipping only, torch's generator only).

Each mechanism is a registered subclass of :class:`NoiseMechanism` that owns its rules as
capabilities (the sampling it needs, randomized clipping, user-level units, sharding, secure
mode), its step rule, its calibration and accounting event, and its JSON form. Nothing outside
these classes branches on a mechanism's name: the planner (:mod:`dprc_core.training.plan`), the
runner, the Trainer and the service ask the object. A new mechanism is one subclass here
(docs/extending.md).

``noise_multiplier`` may be left out only where the engine is given it separately: the
deprecated ``PrivacyEngine(..., noise_multiplier=σ, noise_mechanism=Gaussian())`` spelling.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from dprc_core.accounting import DEFAULT_SETTINGS, PrivacyEvent, SubsampledGaussianEvent
from dprc_core.accounting import noise_multiplier as calibrate_gaussian
from dprc_core.accounting.calibration import gaussian_epsilon
from dprc_core.accounting.describe import sketch_words
from dprc_core.accounting.dpftrl import (
    check_bands,
    check_nu,
    dpftrl_epsilon,
    dpftrl_noise_multiplier,
)
from dprc_core.accounting.events import NuDPFTRLEvent
from dprc_core.accounting.steps import fixed_order_steps, poisson_steps
from dprc_core.mechanism_names import GAUSSIAN, LEGACY_NAMES, NU_DPFTRL
from dprc_core.noise.gaussian import GaussianNoise
from dprc_core.noise.nu_dpftrl import NuDPFTRLNoise
from dprc_core.plan_errors import PlanError

SHARED = "shared"  # the sketch of exact clipping (nothing is drawn)


class PlanFields(Protocol):
    """What a mechanism reads of a plan (:class:`dprc_core.training.plan.PrivacyPlan`)."""

    @property
    def dataset_size(self) -> int: ...

    @property
    def batch_size(self) -> float: ...

    @property
    def epochs(self) -> float: ...

    @property
    def sample_rate(self) -> float: ...

    @property
    def steps(self) -> int: ...

    @property
    def noise_multiplier(self) -> float: ...

    @property
    def clipping(self) -> str: ...

    @property
    def k(self) -> int | None: ...

    @property
    def sketch(self) -> str: ...

    @property
    def scale_width(self) -> float | None: ...

    @property
    def unit(self) -> str: ...

    @property
    def nu(self) -> float | None: ...

    @property
    def bands(self) -> int | None: ...

    @property
    def min_separation(self) -> int | None: ...


def check_noise_multiplier(value: Any) -> float:
    """σ: a finite number >= 0 (bools refused); σ = 0 adds no noise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value >= 0):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {value!r}")
    return float(value)


def _optional_sigma(obj: Any) -> None:
    if obj.noise_multiplier is not None:
        object.__setattr__(obj, "noise_multiplier", check_noise_multiplier(obj.noise_multiplier))


@dataclass(frozen=True)
class Schedule:
    """Plan fields for a caller without a plan (the engine): what a mechanism's
    :meth:`NoiseMechanism.event` reads. ``min_separation``: the steps of one fixed-order epoch
    (fixed-order mechanisms); ``sample_rate``: the Poisson rate (Poisson mechanisms)."""

    noise_multiplier: float
    steps: int
    sample_rate: float = 1.0
    clipping: str = "exact"
    k: int | None = None
    sketch: str = SHARED
    min_separation: int | None = None
    # the hidden-scale law of per-example sketches (None: the current one)
    scale_width: float | None = None
    dataset_size: int = 0
    batch_size: float = 0.0
    epochs: float = 0.0
    unit: str = "example"
    nu: float | None = None
    bands: int | None = None


class NoiseMechanism:
    """The base of the noise mechanisms: a registry by :attr:`name` and the capabilities every
    mechanism states. Subclasses are frozen dataclasses with a ``noise_multiplier`` field."""

    name: ClassVar[str]
    title: ClassVar[str]  # its name in prose ("Gaussian", "ν-DP-FTRL")
    # what the mechanism needs and allows (the planner and the engine ask these)
    sampling: ClassVar[str]  # "poisson" (amplified by sampling) | "fixed_order" (no sampling)
    exact_clipping_only: ClassVar[bool] = False  # randomized clipping refused
    exact_clipping_reason: ClassVar[str] = ""  # why, in the refusal's words
    user_level: ClassVar[bool] = True  # user-level units (docs/privacy_unit.md)
    shardable: ClassVar[bool] = True  # sharding: fsdp (its noise state sharded with the model)
    secure_capable: ClassVar[bool] = False  # secure mode (ChaCha20 noise and batches)
    # one event covers the whole run (a prefix of it after t steps), instead of one event per
    # segment composed: a resumed run's ledger is the prefix, not the segments
    whole_run_event: ClassVar[bool] = False
    # each step's noise independent of the others' (σ·C/B per coordinate of the averaged
    # update: the learnability criterion of dprc_core/training/learnability.py applies)
    independent_noise: ClassVar[bool] = True
    # the JSON fields of to_dict besides "mechanism" (noise_from_dict accepts exactly these)
    json_fields: ClassVar[tuple[str, ...]]

    noise_multiplier: float | None
    secure: bool

    _registry: ClassVar[dict[str, type[NoiseMechanism]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            NoiseMechanism._registry[cls.name] = cls

    # -- the object -----------------------------------------------------------------------

    def sampler(self, std: float) -> Any:
        """The torch-generator sampler of per-step noise with standard deviation ``std``."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """This mechanism as a JSON object (:func:`noise_from_dict` reads it back)."""
        return {"mechanism": self.name, **{f: getattr(self, f) for f in self.json_fields}}

    def with_sigma(self, noise_multiplier: float) -> NoiseMechanism:
        """The same mechanism with noise multiplier σ."""
        return dataclasses.replace(self, noise_multiplier=noise_multiplier)  # type: ignore[type-var]

    def with_secure(self, secure: bool) -> NoiseMechanism:
        """The mechanism as a worker in (or out of) secure mode runs it: only a mechanism that
        can draw from the secure stream takes the setting; the others are unchanged."""
        return self

    def request_fields(self) -> dict[str, Any]:
        """What a job asked of its noise (the API's ``privacy.noise``), without σ."""
        return {"mechanism": self.name}

    # -- the plan's rules -----------------------------------------------------------------

    @classmethod
    def check_options(
        cls, *, randomized: bool, sketch: str | None, unit: str, sharding: str, secure: bool
    ) -> None:
        """Refuse what this mechanism cannot run, naming the plan's field (:class:`PlanError`)."""
        if cls.exact_clipping_only and randomized:
            raise PlanError(
                "clipping",
                f"clipping with randomized norms and {cls.name} noise is refused: "
                f"{cls.exact_clipping_reason}; use exact norms",
            )
        if cls.exact_clipping_only and sketch not in (None, SHARED):
            raise PlanError(
                "sketch", f"sketch applies to randomized clipping, which {cls.name} refuses"
            )
        if unit != "example" and not cls.user_level:
            raise PlanError(
                "noise",
                f"privacy unit {unit!r} takes the {_allowing('user_level')} noise mechanism: "
                f"{cls.name} is accounted per example (fixed-order batches of lines)",
            )
        if sharding != "none" and not cls.shardable:
            raise PlanError(
                "sharding",
                f"sharding={sharding} takes the {_allowing('shardable')} noise mechanism only: "
                f"{cls.name}'s correlated noise state (its noise history) is not sharded over "
                "the ranks",
                code="sharding_unsupported",
            )

    def check_schedule(self, n: int, batch_size: float, epochs: float) -> None:
        """Refuse a batch size or number of epochs this mechanism's sampling cannot run."""
        ok_b = isinstance(batch_size, (int, float)) and not isinstance(batch_size, bool)
        if ok_b and math.isfinite(batch_size) and batch_size > n:
            raise PlanError("batch_size", _larger_than_the_data(batch_size, n))
        if not ok_b or not math.isfinite(batch_size) or not 0 < batch_size:
            raise PlanError("batch_size", f"batch_size must be in (0, N={n}], got {batch_size!r}")
        ok_e = isinstance(epochs, (int, float)) and not isinstance(epochs, bool)
        if not ok_e or not math.isfinite(epochs) or not 0 < epochs <= 10_000:
            raise PlanError("epochs", f"epochs must be a number in (0, 10000], got {epochs!r}")

    def steps(self, n: int, batch_size: float, epochs: float) -> int:
        """The steps a run of ``epochs`` epochs at batch size ``batch_size`` takes."""
        raise NotImplementedError

    def plan_fields(self, n: int, batch_size: float, epochs: float) -> dict[str, Any]:
        """The plan's fields that only this mechanism has (its JSON, checkpoints compare it)."""
        return {}

    def calibrate(self, target_epsilon: float, delta: float, plan: PlanFields) -> float:
        """The smallest σ whose ε at ``delta`` is at most the target, for ``plan``'s schedule
        (its σ field is not read)."""
        raise NotImplementedError

    def epsilon(self, delta: float, plan: PlanFields) -> float:
        """ε at ``delta`` of the whole ``plan``."""
        raise NotImplementedError

    def event(self, plan: PlanFields, steps: int) -> PrivacyEvent:
        """The privacy event of the first ``steps`` steps of ``plan``."""
        raise NotImplementedError

    @classmethod
    def from_plan(cls, plan: PlanFields) -> NoiseMechanism:
        """The mechanism ``plan`` runs, with its σ."""
        raise NotImplementedError

    def accountant_facts(self, plan: PlanFields) -> dict[str, Any]:
        """How ``plan`` is accounted, for people (a job's ``privacy.accountant``)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Gaussian(NoiseMechanism):
    """Independent Gaussian noise N(0, σ²C²) per coordinate (DP-SGD) with noise multiplier
    ``noise_multiplier`` = σ and Poisson sampling; ``secure=True``: drawn from a ChaCha20
    keystream keyed from the OS, as a float64 sum of normals (docs/engine.md, "Secure mode")."""

    noise_multiplier: float | None = None
    secure: bool = False
    name: ClassVar[str] = GAUSSIAN
    title: ClassVar[str] = "Gaussian"
    sampling: ClassVar[str] = "poisson"
    secure_capable: ClassVar[bool] = True
    json_fields: ClassVar[tuple[str, ...]] = ("noise_multiplier", "secure")

    def __post_init__(self) -> None:
        _optional_sigma(self)
        object.__setattr__(self, "secure", bool(self.secure))

    def sampler(self, std: float) -> GaussianNoise:
        """The torch-generator sampler (the engine builds the secure one itself)."""
        return GaussianNoise(std)

    def with_secure(self, secure: bool) -> Gaussian:
        return dataclasses.replace(self, secure=bool(secure))

    def steps(self, n: int, batch_size: float, epochs: float) -> int:
        return poisson_steps(n, batch_size, epochs)

    def calibrate(self, target_epsilon: float, delta: float, plan: PlanFields) -> float:
        return calibrate_gaussian(
            target_epsilon,
            delta,
            plan.sample_rate,
            plan.steps,
            plan.clipping,
            plan.k,
            sketch=plan.sketch,
            scale_width=plan.scale_width,
        )

    def epsilon(self, delta: float, plan: PlanFields) -> float:
        event = self.event(plan, plan.steps)
        assert isinstance(event, SubsampledGaussianEvent)
        return gaussian_epsilon(event, delta)  # the calibration's own composition of σ

    def event(self, plan: PlanFields, steps: int) -> SubsampledGaussianEvent:
        return SubsampledGaussianEvent(
            plan.noise_multiplier,
            plan.sample_rate,
            steps,
            plan.clipping,
            plan.k,
            sketch=plan.sketch,
            scale_width=plan.scale_width,
        )

    @classmethod
    def from_plan(cls, plan: PlanFields) -> Gaussian:
        return cls(plan.noise_multiplier)

    def accountant_facts(self, plan: PlanFields) -> dict[str, Any]:
        per_user = plan.unit == "user"
        return {
            "mechanism": self.name,
            "unit": plan.unit,
            "adjacency": "add/remove of one user with all their lines (epsilon is the larger "
            "of the two directions)"
            if per_user
            else "add/remove (epsilon is the larger of the two directions)",
            "sampling": "poisson over users, at most max_examples_per_user lines each"
            if per_user
            else "poisson",
            "clipping": plan.clipping,
            "k": plan.k,
            "envelope": "dimension-free" if plan.k is not None else None,
            "rank": None,
            "sketch": plan.sketch,
            "sketch_model": sketch_words(plan.clipping, plan.sketch),
            # the hidden-scale law the job is planned, charged and run on (per-example only)
            **({"scale_width": plan.scale_width} if plan.scale_width is not None else {}),
            "steps_rule": "ceil(n_epochs * N / batch_size)"
            + (" (N: users; batch_size: expected users a step)" if per_user else ""),
            "settings": dataclasses.asdict(DEFAULT_SETTINGS),
        }


@dataclass(frozen=True)
class NuDPFTRL(NoiseMechanism):
    """ν-DP-FTRL correlated noise: per-step std σ·C before correlation, damping ``nu`` in
    [0, 1] and optional ``bands`` (None: un-banded). Fixed-order batches (shuffled once,
    cyclic epochs: no amplification claimed), exact clipping only, per-example units, not
    sharded, torch's generator only."""

    noise_multiplier: float | None = None
    nu: float | None = None
    bands: int | None = None
    name: ClassVar[str] = NU_DPFTRL
    title: ClassVar[str] = "ν-DP-FTRL"
    sampling: ClassVar[str] = "fixed_order"
    exact_clipping_only: ClassVar[bool] = True
    exact_clipping_reason: ClassVar[str] = (
        "randomized clipping with correlated noise has no privacy analysis"
    )
    user_level: ClassVar[bool] = False
    shardable: ClassVar[bool] = False
    whole_run_event: ClassVar[bool] = True
    independent_noise: ClassVar[bool] = False
    secure: ClassVar[bool] = False  # type: ignore[misc]  # never drawn from the secure stream
    json_fields: ClassVar[tuple[str, ...]] = ("noise_multiplier", "nu", "bands")

    def __post_init__(self) -> None:
        _optional_sigma(self)
        if self.nu is None:
            raise PlanError("nu", "NuDPFTRL needs nu (the damping, in [0, 1])")
        try:
            object.__setattr__(self, "nu", check_nu(self.nu))
        except ValueError as exc:
            raise PlanError("nu", str(exc)) from None
        try:
            object.__setattr__(self, "bands", check_bands(self.bands))
        except ValueError as exc:
            raise PlanError("bands", str(exc)) from None

    def sampler(self, std: float) -> NuDPFTRLNoise:
        assert self.nu is not None  # checked on construction
        return NuDPFTRLNoise(std, self.nu, self.bands)

    def request_fields(self) -> dict[str, Any]:
        return {"mechanism": self.name, "nu": self.nu, "bands": self.bands}

    def check_schedule(self, n: int, batch_size: float, epochs: float) -> None:
        whole = isinstance(batch_size, int) and not isinstance(batch_size, bool)
        if whole and batch_size > n:
            raise PlanError("batch_size", _larger_than_the_data(batch_size, n))
        if not whole or not 0 < batch_size:
            raise PlanError(
                "batch_size",
                f"{self.name} needs an integer batch_size in [1, N={n}], got {batch_size!r}",
            )
        if isinstance(epochs, bool) or not isinstance(epochs, int) or not 0 < epochs <= 10_000:
            raise PlanError(
                "epochs", f"{self.name} needs an integer number of epochs >= 1, got {epochs!r}"
            )

    def steps(self, n: int, batch_size: float, epochs: float) -> int:
        return fixed_order_steps(n, batch_size, epochs)  # epochs·⌈N/B⌉: whole cyclic epochs

    def plan_fields(self, n: int, batch_size: float, epochs: float) -> dict[str, Any]:
        return {
            "nu": self.nu,
            "bands": self.bands,
            "min_separation": -(-n // int(batch_size)),  # steps per epoch
        }

    def _run(self, plan: PlanFields) -> tuple[float, int, int, int, int | None]:
        assert self.nu is not None and plan.min_separation is not None
        return self.nu, plan.steps, int(plan.epochs), plan.min_separation, self.bands

    def calibrate(self, target_epsilon: float, delta: float, plan: PlanFields) -> float:
        nu, steps, epochs, sep, bands = self._run(plan)
        return dpftrl_noise_multiplier(target_epsilon, delta, nu, steps, epochs, sep, bands=bands)

    def epsilon(self, delta: float, plan: PlanFields) -> float:
        nu, steps, epochs, sep, bands = self._run(plan)
        return dpftrl_epsilon(plan.noise_multiplier, delta, nu, steps, epochs, sep, bands=bands)

    def event(self, plan: PlanFields, steps: int) -> NuDPFTRLEvent:
        """Rows 1..``steps`` of the run's lower-triangular Toeplitz noise: a ν-DP-FTRL run of
        ``steps`` steps with at most ⌈steps/s⌉ participations (s: steps per epoch)."""
        assert self.nu is not None and plan.min_separation is not None
        return NuDPFTRLEvent.prefix(
            plan.noise_multiplier, steps, self.nu, plan.min_separation, self.bands
        )

    @classmethod
    def from_plan(cls, plan: PlanFields) -> NuDPFTRL:
        return cls(plan.noise_multiplier, nu=plan.nu, bands=plan.bands)

    def accountant_facts(self, plan: PlanFields) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "adjacency": "zero-out (implied by add/remove), no amplification",
            "sampling": "fixed order: shuffle once, cyclic epochs",
            "clipping": "exact",
            "nu": self.nu,
            "bands": self.bands,
            "participations": int(plan.epochs),
            "min_separation": plan.min_separation,
            "steps_rule": "n_epochs * ceil(N / batch_size)",
            "sensitivity": "matrix mechanism, as implemented (docs/accounting.md §9)",
            "sketch": SHARED,
        }


def _larger_than_the_data(batch_size: float, n: int) -> str:
    return (
        f"batch_size={batch_size:g} is larger than the data set (N={n}): the expected batch "
        "size must be at most N"
    )


def _allowing(capability: str) -> str:
    """The registered mechanisms that have ``capability``, for a refusal's words."""
    names = [c.name for c in NoiseMechanism._registry.values() if getattr(c, capability)]
    return " or ".join(names) or "no"


def mechanism_class(name: Any) -> type[NoiseMechanism]:
    """The registered mechanism class of ``name`` (an earlier spelling accepted)."""
    if isinstance(name, str):
        name = LEGACY_NAMES.get(name, name)
        if name in NoiseMechanism._registry:
            return NoiseMechanism._registry[name]
    raise PlanError(
        "noise",
        f"noise_mechanism must be one of {mechanism_names()}, got {name!r}",
    )


def mechanism_names() -> tuple[str, ...]:
    """The registered mechanisms' names, in registration order."""
    return tuple(NoiseMechanism._registry)


def noise_from_dict(data: Any) -> NoiseMechanism:
    """The mechanism a ``to_dict`` object describes, by its ``mechanism`` name (unknown
    fields and invalid values refused with a ValueError)."""
    if not isinstance(data, dict):
        raise ValueError(f"a noise mechanism must be a JSON object, got {type(data).__name__}")
    fields = dict(data)
    name = fields.pop("mechanism", None)
    if name not in NoiseMechanism._registry:
        raise ValueError(f"mechanism must be one of {sorted(mechanism_names())}, got {name!r}")
    cls = NoiseMechanism._registry[name]
    unknown = set(fields) - set(cls.json_fields)
    if unknown:
        raise ValueError(f"unknown {name} fields: {sorted(unknown)}")
    return cls(**fields)


def noise_from_request(name: Any, **fields: Any) -> NoiseMechanism:
    """The mechanism a request names with its own fields (no σ yet): fields the mechanism
    does not take are refused naming them (:class:`PlanError`); unset (None) ones are left
    at their defaults."""
    cls = mechanism_class(name)
    given = {k: v for k, v in fields.items() if v is not None}
    own = set(cls.json_fields) - {"noise_multiplier", "secure"}
    for key in given:
        if key not in own:
            raise PlanError(
                key if key in ("nu", "bands") else "noise",
                f"{key} does not apply to noise_mechanism={cls.name!r}",
            )
    return cls(**given)


def as_noise_mechanism(
    value: Any, nu: float | None = None, bands: int | None = None, *, warn: bool = True
) -> NoiseMechanism:
    """A mechanism object from an object or a name; ``nu`` / ``bands`` beside the name
    ``"nu_dpftrl"`` are the deprecated spelling of ``NuDPFTRL(nu=nu, bands=bands)`` (a
    DeprecationWarning unless ``warn=False``)."""
    if isinstance(value, NoiseMechanism):
        if nu is not None or bands is not None:
            raise ValueError("give nu and bands inside NuDPFTRL(nu=..., bands=...), not beside it")
        return value
    mechanism = noise_from_request(value, nu=nu, bands=bands)
    if warn and (nu is not None or bands is not None):
        warnings.warn(
            f"noise_mechanism={mechanism.name!r} with nu=/bands= beside it is deprecated; pass "
            "noise=dprc_core.noise.NuDPFTRL(noise_multiplier, nu=..., bands=...)",
            DeprecationWarning,
            stacklevel=3,
        )
    return mechanism
