"""Privacy events: what happened, one class per mechanism, validated.

Events are separate from the accountant that counts them (as in Google's ``dp_accounting``):
the ledger stores events and recomputes ε from them, and each event class has its PLD built
by one registered builder (:mod:`dprc_core.accounting.pld_builders`).

* :class:`SubsampledGaussianEvent` — ``steps`` Poisson-subsampled Gaussian steps (DP-SGD,
  DP-SGD with randomized norms) with the accountant's ``envelope`` and the ``sketch``.
* :class:`NuDPFTRLEvent` — one whole ν-DP-FTRL run (correlated noise, fixed-order batches).

:class:`PrivacyEvent` is their common base. Called itself with the flat fields of an event
(``PrivacyEvent(σ, q, steps, "hutch", 32, sketch="per_example")`` or
``PrivacyEvent(..., mechanism="nu_dpftrl", nu=..., ...)``), it builds the event of the
mechanism those fields name; :meth:`PrivacyEvent.from_dict` reads the JSON of either class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dprc_core.accounting import dpftrl
from dprc_core.accounting.event_checks import (
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
    check_sketch,
    check_steps,
    is_real,
)
from dprc_core.accounting.renamed_keywords import take_renamed
from dprc_core.mechanism_names import GAUSSIAN, NOISE_MECHANISMS, NU_DPFTRL
from dprc_core.norm_methods import ENVELOPES

__all__ = [
    "CLIPPINGS",
    "DPFTRL_FIELDS",
    "DP_SGD",
    "ENVELOPES",
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
# The fields of an event's JSON ("clipping" holds the envelope).
_JSON_FIELDS = ("noise_multiplier", "sample_rate", "steps", "clipping", "k", "rank", "mechanism")


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
    """Metaclass of the events: calling :class:`PrivacyEvent` itself builds the subclass its
    flat fields name (:func:`_from_flat_fields`); calling a subclass builds that subclass."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is PrivacyEvent:
            if "clipping" in kwargs and len(args) > 3:  # the envelope given by position too
                raise TypeError(
                    "PrivacyEvent() got both 'envelope' and its deprecated name 'clipping'"
                )
            take_renamed(kwargs, "clipping", "envelope", "PrivacyEvent", stacklevel=2)
            return _from_flat_fields(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class PrivacyEvent(metaclass=_EventType):
    """What a mechanism did, to be accounted: the base of one frozen dataclass per mechanism.

    Every event has a noise multiplier σ, a number of ``steps`` and the fields below (constant
    where a mechanism does not vary them), its ``mechanism`` name, :meth:`to_dict` and
    :meth:`from_dict`. ``clipping`` is the envelope under its earlier name.
    """

    mechanism: ClassVar[str]
    noise_multiplier: float
    sample_rate: float
    steps: int
    envelope: str
    k: int | None
    rank: int | None
    sketch: str

    if TYPE_CHECKING:
        # the flat form, answered by _EventType.__call__ with the subclass it names
        def __init__(
            self,
            noise_multiplier: float,
            sample_rate: float,
            steps: int,
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

    def to_dict(self) -> dict[str, Any]:
        """The event's JSON object (ledgers, checkpoints and the service's rows hold it)."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyEvent:
        """The event a JSON object written by :meth:`to_dict` describes, of the class its
        ``mechanism`` names (the Poisson-subsampled Gaussian when absent); on a subclass, an
        event of another class is refused."""
        if not isinstance(data, dict):
            raise ValueError(f"an event must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - {*_JSON_FIELDS, *DPFTRL_FIELDS, "sketch"}
        if unknown:
            raise ValueError(f"unknown event fields: {sorted(unknown)}")
        missing = {"noise_multiplier", "sample_rate", "steps"} - set(data)
        if missing:
            raise ValueError(f"event is missing fields: {sorted(missing)}")
        fields = dict(data)
        if "clipping" in fields:
            fields["envelope"] = fields.pop("clipping")
        event = _from_flat_fields(**fields)
        if not isinstance(event, cls):
            raise ValueError(f"expected a {cls.__name__}, got a {event.mechanism} event")
        return event

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
        """A ν-DP-FTRL run (:class:`NuDPFTRLEvent`); its sensitivity is computed."""
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
        """:meth:`NuDPFTRLEvent.prefix`."""
        return NuDPFTRLEvent.prefix(noise_multiplier, steps, nu, min_separation, bands)


@dataclass(frozen=True)
class SubsampledGaussianEvent(PrivacyEvent):
    """``steps`` Poisson-subsampled (rate ``sample_rate``) Gaussian steps with noise
    multiplier σ (DP-SGD), and the accountant's ``envelope`` of the clipped contribution:
    ``exact`` norms, or randomized ``hutch`` / ``hutchpp`` with projection dimension ``k`` and
    optional total rank D for the Hutch rank-dependent envelope. ``sketch`` says how a
    randomized method drew its projections: ``"shared"`` (one per layer per step for the
    batch; the revealed-scale model) or ``"per_example"`` (independent per example; the
    hidden-scale model, docs/accounting.md §10)."""

    mechanism: ClassVar[str] = GAUSSIAN
    noise_multiplier: float
    sample_rate: float
    steps: int
    envelope: str = "exact"
    k: int | None = None
    rank: int | None = None
    sketch: str = SHARED_SKETCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))
        envelope, k, rank = check_envelope(self.envelope, self.k, self.rank)
        object.__setattr__(self, "envelope", envelope)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "sketch", check_sketch(self.sketch, envelope))

    def to_dict(self) -> dict[str, Any]:
        """``sketch`` is written only when it is not the default ``"shared"``."""
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
        return data


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
    noise_multiplier: float
    steps: int
    nu: float
    participations: int
    min_separation: int
    bands: int | None = None
    sensitivity: float | None = None
    # constant for this mechanism: no sampling, exact norms, no sketch
    sample_rate: float = field(default=1.0, init=False, repr=False, compare=False)
    envelope: str = field(default="exact", init=False, repr=False, compare=False)
    k: int | None = field(default=None, init=False, repr=False, compare=False)
    rank: int | None = field(default=None, init=False, repr=False, compare=False)
    sketch: str = field(default=SHARED_SKETCH, init=False, repr=False, compare=False)

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


def _from_flat_fields(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
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
) -> PrivacyEvent:
    """The event of the mechanism named by ``mechanism`` (any spelling), from the fields of
    every event class together; a field the mechanism does not have must be left unset."""
    mechanism = check_mechanism(mechanism)
    sigma = check_noise_multiplier(noise_multiplier)
    q = check_sample_rate(sample_rate)
    steps = check_steps(steps)
    ftrl = {
        "nu": nu,
        "bands": bands,
        "participations": participations,
        "min_separation": min_separation,
        "sensitivity": sensitivity,
    }
    if mechanism != NU_DPFTRL:
        present = [f for f in DPFTRL_FIELDS if ftrl[f] is not None]
        if present:
            raise ValueError(f"fields {present} are only meaningful for mechanism {NU_DPFTRL!r}")
        return SubsampledGaussianEvent(sigma, q, steps, envelope, k, rank, sketch)
    dpftrl.check_dpftrl_clipping(envelope)
    if k is not None or rank is not None:
        raise ValueError("k and rank are only meaningful for randomized clipping")
    if sketch != SHARED_SKETCH:
        raise ValueError("sketch is only meaningful for randomized clipping")
    if q != 1.0:
        raise ValueError(
            f"nu_dpftrl claims no amplification by sampling: sample_rate must be 1 (got {q})"
        )
    missing = [f for f in ("nu", "participations", "min_separation") if ftrl[f] is None]
    if missing:
        raise ValueError(f"a {NU_DPFTRL} event needs {missing}")
    assert nu is not None and participations is not None and min_separation is not None
    return NuDPFTRLEvent(sigma, steps, nu, participations, min_separation, bands, sensitivity)
