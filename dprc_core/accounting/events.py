"""Privacy events: what happened, one plain dataclass per mechanism, validated.

Events are separate from the accountant that counts them (as in Google's ``dp_accounting``):
the ledger stores events and recomputes ε from them, and each event class has its PLD built
by one registered builder (:mod:`dprc_core.accounting.pld_builders`). Registering the builder
registers the class under its :attr:`~PrivacyEvent.mechanism` name, the name
:meth:`PrivacyEvent.from_dict` reads back.

* :class:`SubsampledGaussianEvent` — ``steps`` Poisson-subsampled Gaussian steps (DP-SGD,
  DP-SGD with randomized norms) with the accountant's ``envelope`` and the ``sketch``.
* :class:`NuDPFTRLEvent` — one whole ν-DP-FTRL run (correlated noise, fixed-order batches).

:class:`PrivacyEvent` is their common interface. Calling it with the flat fields of every
event class together (``PrivacyEvent(σ, q, steps, "hutch", 32)``) is deprecated: it is
answered by :func:`dprc_core.accounting.events_compat.flat_event`, with a warning.
"""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from dprc_core.accounting import dpftrl
from dprc_core.accounting.event_checks import (
    HIDDEN_SCALE_WIDTH,
    LEGACY_HIDDEN_SCALE_WIDTH,
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    SKETCHES,
    check_clipping,
    check_delta,
    check_envelope,
    check_epsilon,
    check_mechanism,
    check_noise_multiplier,
    check_sample_rate,
    check_scale_width,
    check_sketch,
    check_steps,
    is_real,
    recorded_scale_width,
)
from dprc_core.accounting.renamed_keywords import take_renamed
from dprc_core.mechanism_names import (
    ENVELOPES,
    GAUSSIAN,
    LEGACY_NAMES,
    NOISE_MECHANISMS,
    NU_DPFTRL,
)

__all__ = [
    "CLIPPINGS",
    "DPFTRL_FIELDS",
    "DP_SGD",
    "ENVELOPES",
    "HIDDEN_SCALE_WIDTH",
    "LEGACY_HIDDEN_SCALE_WIDTH",
    "NU_DPFTRL",
    "PER_EXAMPLE_SKETCH",
    "SHARED_SKETCH",
    "SKETCHES",
    "SUPPORTED_MECHANISMS",
    "NuDPFTRLEvent",
    "PrivacyEvent",
    "SubsampledGaussianEvent",
    "UnsupportedMechanismError",
    "check_clipping",
    "check_delta",
    "check_envelope",
    "check_epsilon",
    "check_mechanism",
    "check_noise_multiplier",
    "check_sample_rate",
    "check_sketch",
    "check_steps",
    "default_sketch",
]

# The accountant's envelope families (exact norms, or the Hutchinson / Hutch++ envelope of
# randomized norms; each norm method's family is in dprc_core.norm_methods). CLIPPINGS is the
# same tuple under its earlier name.
CLIPPINGS = ENVELOPES
# The noise mechanism's one name (dprc_core.noise); older ledgers' "dp-sgd" / "nu-dp-ftrl"
# are read as these.
DP_SGD = GAUSSIAN  # "gaussian": Poisson-subsampled Gaussian (DP-SGD, DP-SGD-RC)
SUPPORTED_MECHANISMS = NOISE_MECHANISMS
# Fields only a ν-DP-FTRL event writes to its JSON.
DPFTRL_FIELDS = ("nu", "bands", "participations", "min_separation", "sensitivity")

Ev = TypeVar("Ev", bound="PrivacyEvent")


def default_sketch(randomized: bool) -> str:
    """The sketch a *mechanism* uses where none is asked for (the engine, the runner, the
    planner, DPTrainer and the service): per-example projections for a randomized norm method —
    the hidden-scale model needs a smaller σ for the same ε (docs/engine.md, "Shared or
    per-example sketches") — and ``"shared"`` (nothing is drawn) for exact norms. The
    accountant's own functions and records keep ``"shared"`` as their default: a bound computed
    or read without saying which sketch ran must hold for both, and the revealed-scale one
    does."""
    return PER_EXAMPLE_SKETCH if randomized else SHARED_SKETCH


class UnsupportedMechanismError(NotImplementedError):
    """A mechanism (an event type) this accountant cannot account for."""


class _EventType(type):
    """Metaclass of the events, for the deprecated flat form only: calling
    :class:`PrivacyEvent` itself is answered by
    :func:`~dprc_core.accounting.events_compat.flat_event` (with a ``DeprecationWarning``);
    calling an event class builds that class."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is PrivacyEvent:
            return flat_event(*args, _where="PrivacyEvent", _stacklevel=3, **kwargs)
        return super().__call__(*args, **kwargs)


class PrivacyEvent(metaclass=_EventType):
    """What a mechanism did, to be accounted: the common interface of the event classes (one
    frozen dataclass per mechanism, each with its own fields, validated in ``__post_init__``).

    An event class names its mechanism (:attr:`mechanism`), writes its JSON object
    (:meth:`to_dict`) and reads it back (:meth:`from_json_fields`, through :meth:`from_dict`), and
    says what the accountant and its command line read of every event: ``noise_multiplier``,
    ``steps``, ``sample_rate`` (1 without sampling), the ``envelope`` with ``k`` and ``rank``,
    the ``sketch``, and whether its batches are fixed-order (:attr:`fixed_order`). A class is
    accounted once its PLD builder is registered
    (:func:`dprc_core.accounting.pld_builders.pld_builder`), which registers its name too.
    """

    mechanism: ClassVar[str]
    # the job's batches are fixed-order epochs (steps = epochs·⌈N/B⌉), not Poisson-sampled
    fixed_order: ClassVar[bool] = False
    # keys of the class's JSON object beyond "mechanism", and those that must be there
    json_fields: ClassVar[tuple[str, ...]] = ()
    required_json_fields: ClassVar[tuple[str, ...]] = ()
    noise_multiplier: float
    steps: int

    if TYPE_CHECKING:
        # what every event answers (a dataclass field of its class, or a constant of it)
        @property
        def sample_rate(self) -> float: ...
        @property
        def envelope(self) -> str: ...
        @property
        def k(self) -> int | None: ...
        @property
        def rank(self) -> int | None: ...
        @property
        def sketch(self) -> str: ...

        # the deprecated flat form, answered by events_compat.flat_event
        def __init__(
            self,
            noise_multiplier: float,
            sample_rate: float | None = None,
            steps: int | None = None,
            envelope: str = "exact",
            k: int | None = None,
            rank: int | None = None,
            mechanism: str = DP_SGD,
            nu: float | None = None,
            bands: int | None = None,
            participations: int | None = None,
            min_separation: int | None = None,
            sensitivity: float | None = None,
            sketch: str = SHARED_SKETCH,
            *,
            clipping: str | None = None,
        ) -> None: ...

    @property
    def clipping(self) -> str:
        """The envelope (``exact`` | ``hutch`` | ``hutchpp``) under its earlier name."""
        return self.envelope

    @property
    def mu(self) -> float:
        """μ = sensitivity/σ of a ν-DP-FTRL event (the whole run is one Gaussian mechanism)."""
        raise ValueError("mu is defined for nu_dpftrl events only")

    def first_steps(self, steps: int) -> PrivacyEvent:
        """The event of this event's first ``steps`` steps (a job settled after ``steps``)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The event's JSON object (ledgers, checkpoints and the service's rows hold it)."""
        raise NotImplementedError

    @classmethod
    def from_json_fields(cls: type[Ev], fields: dict[str, Any]) -> Ev:
        """The event of this class from its JSON fields (checked by :meth:`from_dict`: no
        unknown key, the required ones present, other classes' keys dropped)."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyEvent:
        """The event a JSON object written by :meth:`to_dict` describes, of the registered
        class its ``mechanism`` names (any spelling; the Poisson-subsampled Gaussian when
        absent); on an event class, an event of another class is refused."""
        if not isinstance(data, dict):
            raise ValueError(f"an event must be a JSON object, got {type(data).__name__}")
        event_type = event_type_named(data.get("mechanism", DP_SGD))
        known = {"mechanism"}.union(*(t.json_fields for t in registered_event_types()))
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown event fields: {sorted(unknown)}")
        own = {f: v for f, v in data.items() if f in event_type.json_fields}
        foreign = [f for f in data if f not in own and f != "mechanism" and data[f] is not None]
        if foreign:
            owners = [t.mechanism for t in registered_event_types() if foreign[0] in t.json_fields]
            raise ValueError(f"fields {foreign} are only meaningful for mechanism {owners[0]!r}")
        missing = set(event_type.required_json_fields) - set(own)
        if missing:
            raise ValueError(f"event is missing fields: {sorted(missing)}")
        if not issubclass(event_type, cls):
            raise ValueError(f"expected a {cls.__name__}, got a {event_type.mechanism} event")
        return event_type.from_json_fields(own)

    @classmethod
    def nu_dpftrl(
        cls,
        noise_multiplier: float,
        steps: int,
        nu: float,
        participations: int,
        min_separation: int,
        bands: int | None = None,
    ) -> NuDPFTRLEvent:
        """Deprecated: build :class:`NuDPFTRLEvent` itself (its sensitivity is computed)."""
        _deprecated("PrivacyEvent.nu_dpftrl(...)", "NuDPFTRLEvent(...)")
        return NuDPFTRLEvent(noise_multiplier, steps, nu, participations, min_separation, bands)

    @classmethod
    def nu_dpftrl_prefix(
        cls,
        noise_multiplier: float,
        steps: int,
        nu: float,
        min_separation: int,
        bands: int | None = None,
    ) -> NuDPFTRLEvent:
        """Deprecated: :meth:`NuDPFTRLEvent.prefix`."""
        _deprecated("PrivacyEvent.nu_dpftrl_prefix(...)", "NuDPFTRLEvent.prefix(...)")
        return NuDPFTRLEvent.prefix(noise_multiplier, steps, nu, min_separation, bands)


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated, use {new}", DeprecationWarning, stacklevel=3)


@dataclass(frozen=True)
class SubsampledGaussianEvent(PrivacyEvent):
    """``steps`` Poisson-subsampled (rate ``sample_rate``) Gaussian steps with noise
    multiplier σ (DP-SGD), and the accountant's ``envelope`` of the clipped contribution:
    ``exact`` norms, or randomized ``hutch`` / ``hutchpp`` with projection dimension ``k`` and
    optional total rank D for the Hutch rank-dependent envelope. ``sketch`` says how a
    randomized method drew its projections: ``"shared"`` (one per layer per step for the
    batch; the revealed-scale model) or ``"per_example"`` (independent per example; the
    hidden-scale model, docs/accounting.md §10).

    ``scale_width``: the relative bin width of the hidden-scale model's scale law, a property
    of the event so that a job is accounted on the law it was planned and charged on. For a
    per-example event ``None`` is the current law (:data:`HIDDEN_SCALE_WIDTH`, 1 %); its JSON
    always writes it, and a per-example event read without it was written before the width was
    recorded, on the legacy law (:data:`LEGACY_HIDDEN_SCALE_WIDTH`, 0.1 %). Every other event
    has none (``None``; a value is refused). Events that differ only in their width are two
    events (never merged)."""

    mechanism: ClassVar[str] = GAUSSIAN
    json_fields: ClassVar[tuple[str, ...]] = (
        "noise_multiplier",
        "sample_rate",
        "steps",
        "clipping",
        "k",
        "rank",
        "sketch",
        "scale_width",
    )
    required_json_fields: ClassVar[tuple[str, ...]] = ("noise_multiplier", "sample_rate", "steps")
    noise_multiplier: float
    sample_rate: float
    steps: int
    envelope: str = "exact"
    k: int | None = None
    rank: int | None = None
    sketch: str = SHARED_SKETCH
    scale_width: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))
        envelope, k, rank = check_envelope(self.envelope, self.k, self.rank)
        object.__setattr__(self, "envelope", envelope)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "sketch", check_sketch(self.sketch, envelope))
        if self.sketch == PER_EXAMPLE_SKETCH:
            width = HIDDEN_SCALE_WIDTH if self.scale_width is None else self.scale_width
            object.__setattr__(self, "scale_width", check_scale_width(width))
        elif self.scale_width is not None:
            raise ValueError(
                "scale_width applies to per-example sketches (the hidden-scale model) only: "
                "only hidden-scale events have their own scale law, got "
                f"scale_width={self.scale_width!r} with sketch={self.sketch!r}"
            )

    def first_steps(self, steps: int) -> SubsampledGaussianEvent:
        """``steps`` of the same independent steps."""
        return replace(self, steps=steps)

    def to_dict(self) -> dict[str, Any]:
        """``sketch`` is written only when it is not the default ``"shared"``; a per-example
        event writes its ``scale_width``."""
        data: dict[str, Any] = {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "clipping": self.envelope,
            "k": self.k,
            "rank": self.rank,
            "mechanism": self.mechanism,
        }
        if self.sketch != SHARED_SKETCH:
            data["sketch"] = self.sketch
        if self.scale_width is not None:
            data["scale_width"] = self.scale_width
        return data

    @classmethod
    def from_json_fields(cls, fields: dict[str, Any]) -> SubsampledGaussianEvent:
        """A per-example event without ``scale_width`` was written before the width was
        recorded: it was planned, charged and run on the legacy law (0.1 %), and keeps it."""
        sketch = fields.get("sketch", SHARED_SKETCH)
        width = recorded_scale_width(fields)
        return cls(
            fields["noise_multiplier"],
            fields["sample_rate"],
            fields["steps"],
            fields.get("clipping", "exact"),
            fields.get("k"),
            fields.get("rank"),
            sketch,
            width,
        )


@dataclass(frozen=True)
class NuDPFTRLEvent(PrivacyEvent):
    """One whole ν-DP-FTRL run of ``steps`` steps with per-step noise std σ·C (before
    correlation), damping ``nu``, ``bands`` (None: un-banded), fixed-order batches in which an
    example takes part at most ``participations`` times, any two at least ``min_separation``
    steps apart. Exact norms only and no sampling (``sample_rate`` is 1: no amplification is
    claimed). ``sensitivity`` is recomputed from the other fields
    (:func:`dprc_core.accounting.dpftrl.dpftrl_sensitivity`); a given value is kept only if it
    is larger (conservative), never used to lower it."""

    mechanism: ClassVar[str] = NU_DPFTRL
    fixed_order: ClassVar[bool] = True
    # its JSON writes the Gaussian event's keys too, with this mechanism's constants
    json_fields: ClassVar[tuple[str, ...]] = (
        "noise_multiplier",
        "sample_rate",
        "steps",
        "clipping",
        "k",
        "rank",
        "sketch",
        *DPFTRL_FIELDS,
    )
    required_json_fields: ClassVar[tuple[str, ...]] = ("noise_multiplier", "steps")
    noise_multiplier: float
    steps: int
    nu: float
    participations: int
    min_separation: int
    bands: int | None = None
    sensitivity: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "steps", check_steps(self.steps))
        required = ("nu", "participations", "min_separation")
        missing = [f for f in required if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {NU_DPFTRL} event needs {missing}")
        nu, parts, sep = self.nu, self.participations, self.min_separation
        details = dpftrl.dpftrl_sensitivity_details(nu, self.steps, parts, sep, self.bands)
        object.__setattr__(self, "nu", float(nu))
        object.__setattr__(self, "participations", int(parts))
        object.__setattr__(self, "min_separation", int(sep))
        sens = details.value
        if self.sensitivity is not None:
            stored = self.sensitivity
            if not is_real(stored) or not math.isfinite(stored) or stored <= 0:
                raise ValueError(f"sensitivity must be a finite number > 0, got {stored!r}")
            # a smaller stored value (tampering, or a ledger from a version with a looser
            # algorithm) never lowers the recomputed one; a larger one is kept (conservative)
            sens = max(sens, float(stored))
        object.__setattr__(self, "sensitivity", sens)

    # constant for this mechanism: no sampling, exact norms, no sketch
    @property
    def sample_rate(self) -> float:
        return 1.0

    @property
    def envelope(self) -> str:
        return "exact"

    @property
    def k(self) -> int | None:
        return None

    @property
    def rank(self) -> int | None:
        return None

    @property
    def sketch(self) -> str:
        return SHARED_SKETCH

    @classmethod
    def prefix(
        cls,
        noise_multiplier: float,
        steps: int,
        nu: float,
        min_separation: int,
        bands: int | None = None,
    ) -> NuDPFTRLEvent:
        """The first ``steps`` released steps of a ν-DP-FTRL run whose epochs are
        ``min_separation`` steps long: rows 1..steps of the same lower-triangular Toeplitz
        noise, i.e. a ν-DP-FTRL run of ``steps`` steps with at most ⌈steps / min_separation⌉
        participations per example. The one builder of a (partial) run's event: the planner,
        the runner and the service's budgets all use it."""
        return cls(
            noise_multiplier,
            steps=steps,
            nu=nu,
            participations=-(-steps // min_separation),
            min_separation=min_separation,
            bands=bands,
        )

    @property
    def mu(self) -> float:
        """μ = sensitivity/σ (the whole run is one Gaussian mechanism)."""
        assert self.sensitivity is not None  # set in __post_init__
        return self.sensitivity / self.noise_multiplier

    def first_steps(self, steps: int) -> NuDPFTRLEvent:
        """Rows 1..``steps`` of the same run (:meth:`prefix`)."""
        return self.prefix(self.noise_multiplier, steps, self.nu, self.min_separation, self.bands)

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "clipping": self.envelope,
            "k": None,
            "rank": None,
            "mechanism": self.mechanism,
            "nu": self.nu,
            "bands": self.bands,
            "participations": self.participations,
            "min_separation": self.min_separation,
            "sensitivity": self.sensitivity,
        }

    @classmethod
    def from_json_fields(cls, fields: dict[str, Any]) -> NuDPFTRLEvent:
        """The Gaussian event's keys must hold this mechanism's constants (no sampling, exact
        norms, no sketch)."""
        check_noise_multiplier(fields["noise_multiplier"])
        q = check_sample_rate(fields.get("sample_rate", 1.0))
        check_steps(fields["steps"])
        dpftrl.check_dpftrl_envelope(fields.get("clipping", "exact"))
        if fields.get("k") is not None or fields.get("rank") is not None:
            raise ValueError("k and rank are only meaningful for randomized clipping")
        if fields.get("sketch", SHARED_SKETCH) != SHARED_SKETCH:
            raise ValueError("sketch is only meaningful for randomized clipping")
        if q != 1.0:
            raise ValueError(
                f"nu_dpftrl claims no amplification by sampling: sample_rate must be 1 (got {q})"
            )
        missing = [f for f in ("nu", "participations", "min_separation") if fields.get(f) is None]
        if missing:
            raise ValueError(f"a {NU_DPFTRL} event needs {missing}")
        return cls(
            fields["noise_multiplier"],
            fields["steps"],
            fields["nu"],
            fields["participations"],
            fields["min_separation"],
            fields.get("bands"),
            fields.get("sensitivity"),
        )


# -- the deprecated flat form, answered here only ------------------------------------------


def _fields(
    noise_multiplier: float | None = None,
    sample_rate: float | None = None,
    steps: int | None = None,
    envelope: str = "exact",
    k: int | None = None,
    rank: int | None = None,
    mechanism: str = DP_SGD,
    nu: float | None = None,
    bands: int | None = None,
    participations: int | None = None,
    min_separation: int | None = None,
    sensitivity: float | None = None,
    sketch: str = SHARED_SKETCH,
) -> dict[str, Any]:
    """The flat fields as the event's JSON object (``clipping`` holds the envelope), the
    fields left unset left out."""
    data = {
        "noise_multiplier": noise_multiplier,
        "sample_rate": sample_rate,
        "steps": steps,
        "clipping": envelope,
        "k": k,
        "rank": rank,
        "mechanism": mechanism,
        "nu": nu,
        "bands": bands,
        "participations": participations,
        "min_separation": min_separation,
        "sensitivity": sensitivity,
        "sketch": sketch,
    }
    return {key: value for key, value in data.items() if value is not None}


def flat_event(
    *args: Any, _where: str = "flat_event", _stacklevel: int = 2, **kwargs: Any
) -> PrivacyEvent:
    """Deprecated: the event of the mechanism the flat fields name (``noise_multiplier,
    sample_rate, steps, envelope="exact", k=None, rank=None, mechanism="gaussian", nu=None,
    bands=None, participations=None, min_separation=None, sensitivity=None,
    sketch="shared"``; ``clipping``: the deprecated name of ``envelope``), validated by its
    class. A field the mechanism does not have must be left unset; a ν-DP-FTRL run's
    ``sample_rate`` may be left out (it is 1)."""
    warnings.warn(
        f"{_where}() with the flat fields of every event class is deprecated: build the "
        "event's class (SubsampledGaussianEvent, NuDPFTRLEvent, ...) directly",
        DeprecationWarning,
        stacklevel=_stacklevel,
    )
    if "clipping" in kwargs and len(args) > 3:  # the envelope given by position too
        raise TypeError(f"{_where}() got both 'envelope' and its deprecated name 'clipping'")
    take_renamed(kwargs, "clipping", "envelope", _where, stacklevel=_stacklevel)
    event = PrivacyEvent.from_dict(_fields(*args, **kwargs))
    if isinstance(event, SubsampledGaussianEvent) and event.scale_width is not None:
        # an event built now, not read from JSON written before the law was recorded
        return replace(event, scale_width=HIDDEN_SCALE_WIDTH)
    return event


# -- the event classes by name ---------------------------------------------------------------

_EVENT_TYPES: dict[str, type[PrivacyEvent]] = {}
# the modules whose builders register the built-in event classes; the package imports lazily
# (dprc_core/accounting/__init__.py), so they are imported before the registry is read
_BUILTIN_BUILDERS = (
    "dprc_core.accounting.subsampled_gaussian_builder",
    "dprc_core.accounting.nu_dpftrl_builder",
)


def with_builtin_event_types() -> dict[str, type[PrivacyEvent]]:
    """The registry, with the built-in event classes registered."""
    for module in _BUILTIN_BUILDERS:
        importlib.import_module(module)
    return _EVENT_TYPES


def register_event_type(event_type: type[PrivacyEvent]) -> None:
    """Register ``event_type`` under its ``mechanism`` name (one class per name); the
    accountant's builders call it (:func:`dprc_core.accounting.pld_builders.pld_builder`)."""
    named = _EVENT_TYPES.get(event_type.mechanism)
    if named is not None and named is not event_type:
        raise ValueError(
            f"mechanism {event_type.mechanism!r} is already the name of {named.__name__}"
        )
    _EVENT_TYPES[event_type.mechanism] = event_type


def registered_event_types() -> tuple[type[PrivacyEvent], ...]:
    """The registered event classes, in the order they were registered."""
    return tuple(with_builtin_event_types().values())


def event_type_named(name: object) -> type[PrivacyEvent]:
    """The registered event class whose ``mechanism`` is ``name`` (or one of its earlier
    spellings, :data:`dprc_core.mechanism_names.LEGACY_NAMES`); ``ValueError`` naming the
    registered mechanisms otherwise."""
    types = with_builtin_event_types()
    if isinstance(name, str):
        event_type = types.get(LEGACY_NAMES.get(name, name))
        if event_type is not None:
            return event_type
    names = sorted(_EVENT_TYPES)
    spellings = (*names, *(old for old, new in LEGACY_NAMES.items() if new in _EVENT_TYPES))
    raise ValueError(f"unknown mechanism {name!r}; expected one of {spellings}")
