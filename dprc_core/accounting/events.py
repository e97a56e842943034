"""Privacy events: what happened (σ, q, steps, clipping, k, rank, mechanism), validated.

Events are separate from the accountant that counts them (as in Google's ``dp_accounting``):
the ledger stores events and recomputes ε from them.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from dprc_core.accounting.envelope import check_k, check_rank
from dprc_core.mechanism_names import GAUSSIAN, NOISE_MECHANISMS, NU_DPFTRL, canonical_mechanism
from dprc_core.norm_methods import ENVELOPES

# The accountant's clipping families: exact norms, or the Hutchinson / Hutch++ envelope of
# randomized clipping (each norm method's family is in dprc_core.norm_methods).
CLIPPINGS = ENVELOPES
# The noise mechanism's one name (dprc_core.noise); older ledgers' "dp-sgd" / "nu-dp-ftrl"
# are read as these.
DP_SGD = GAUSSIAN  # "gaussian": Poisson-subsampled Gaussian (DP-SGD, DP-SGD-RC)
SUPPORTED_MECHANISMS = NOISE_MECHANISMS
# Fields only a ν-DP-FTRL event has; they are left out of a DP-SGD event's JSON, so ledgers
# holding DP-SGD events only are written exactly as before (ledger JSON v1).
DPFTRL_FIELDS = ("nu", "bands", "participations", "min_separation", "sensitivity")
# How the randomized-clipping sketch was drawn (docs/accounting.md §10): "shared" — one
# projection per layer per step for the whole batch, accounted with the revealed-scale model
# (the adversary is given the scale a); "per_example" — an independent projection per example,
# per layer, per step, accounted with the hidden-scale model. "shared" is the default and what
# ledgers without the field mean; it is written only when it is not the default, so ledgers of
# shared-sketch and exact events are written exactly as before.
SHARED_SKETCH = "shared"
PER_EXAMPLE_SKETCH = "per_example"
SKETCHES = (SHARED_SKETCH, PER_EXAMPLE_SKETCH)


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
    """A mechanism this accountant cannot (yet) account for."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_noise_multiplier(sigma: Any) -> float:
    if not _is_real(sigma) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {sigma!r}")
    return float(sigma)


def check_sample_rate(q: Any) -> float:
    if not _is_real(q) or not math.isfinite(q) or not 0 < q <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {q!r}")
    return float(q)


def check_steps(steps: Any) -> int:
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    return int(steps)


def check_delta(delta: Any) -> float:
    if not _is_real(delta) or not math.isfinite(delta) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon: Any) -> float:
    if not _is_real(epsilon) or not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def check_clipping(clipping: Any, k: Any, rank: Any) -> tuple[str, int | None, int | None]:
    """Validate the clipping method with its projection dimension k and total rank."""
    if clipping not in CLIPPINGS:
        raise ValueError(f"clipping must be one of {CLIPPINGS}, got {clipping!r}")
    if clipping == "exact":
        if k is not None:
            raise ValueError("k is only meaningful for randomized clipping (hutch/hutchpp)")
        if rank is not None:
            raise ValueError("rank is only meaningful for randomized clipping (hutch/hutchpp)")
        return clipping, None, None
    if k is None:
        raise ValueError(f"clipping={clipping!r} needs the projection dimension k")
    if clipping == "hutchpp" and rank is not None:
        raise ValueError(
            "rank applies to clipping='hutch' only: Hutch++ is always accounted with the "
            "dimension-free envelope, so a rank would be ignored"
        )
    return clipping, check_k(k), check_rank(rank)


def check_mechanism(mechanism: Any) -> str:
    return canonical_mechanism(mechanism)


def check_sketch(sketch: Any, clipping: str) -> str:
    """Validate how the sketch was drawn; ``per_example`` needs randomized clipping."""
    if sketch not in SKETCHES:
        raise ValueError(f"sketch must be one of {SKETCHES}, got {sketch!r}")
    if sketch == PER_EXAMPLE_SKETCH and clipping == "exact":
        raise ValueError(
            "sketch='per_example' applies to randomized clipping (hutch/hutchpp) only: exact "
            "norms draw no sketch"
        )
    return str(sketch)


@dataclass(frozen=True)
class PrivacyEvent:
    """``steps`` Poisson-subsampled (rate ``sample_rate``) DP-SGD steps with noise multiplier
    σ and the given clipping (``exact``, or randomized ``hutch`` / ``hutchpp`` with projection
    dimension ``k`` and optional total rank D for the Hutch rank-dependent envelope).
    ``sketch`` says how a randomized method drew its projections: ``"shared"`` (one per layer
    per step for the batch; the revealed-scale model) or ``"per_example"`` (independent per
    example; the hidden-scale model, docs/accounting.md §10).

    ``mechanism="nu_dpftrl"``: one whole ν-DP-FTRL run of ``steps`` steps with per-step noise
    std σ·C (before correlation), damping ``nu``, ``bands`` (None: un-banded), fixed-order
    batches in which an example takes part at most ``participations`` times, any two at least
    ``min_separation`` steps apart. Exact clipping only; ``sample_rate`` must be 1 (no
    amplification by sampling is claimed). ``sensitivity`` is recomputed from the other fields
    (:func:`dprc_core.accounting.dpftrl.dpftrl_sensitivity`); a stored value is kept only if it
    is larger (conservative), never used to lower it. Build it with :meth:`nu_dpftrl`.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    clipping: str = "exact"
    k: int | None = None
    rank: int | None = None
    mechanism: str = DP_SGD
    nu: float | None = None
    bands: int | None = None
    participations: int | None = None
    min_separation: int | None = None
    sensitivity: float | None = None
    sketch: str = SHARED_SKETCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "mechanism", check_mechanism(self.mechanism))
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))
        if self.mechanism == NU_DPFTRL:
            self._check_dpftrl()
            return
        present = [f for f in DPFTRL_FIELDS if getattr(self, f) is not None]
        if present:
            raise ValueError(f"fields {present} are only meaningful for mechanism {NU_DPFTRL!r}")
        clipping, k, rank = check_clipping(self.clipping, self.k, self.rank)
        object.__setattr__(self, "clipping", clipping)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "sketch", check_sketch(self.sketch, clipping))

    def _check_dpftrl(self) -> None:
        # imported here: dpftrl.py is pure numpy/scipy and does not import this module
        from dprc_core.accounting import dpftrl

        dpftrl.check_dpftrl_clipping(self.clipping)
        if self.k is not None or self.rank is not None:
            raise ValueError("k and rank are only meaningful for randomized clipping")
        if self.sketch != SHARED_SKETCH:
            raise ValueError("sketch is only meaningful for randomized clipping")
        if self.sample_rate != 1.0:
            raise ValueError(
                "nu_dpftrl claims no amplification by sampling: sample_rate must be 1 "
                f"(got {self.sample_rate})"
            )
        required = ("nu", "participations", "min_separation")
        missing = [f for f in required if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {NU_DPFTRL} event needs {missing}")
        nu, parts, sep = self.nu, self.participations, self.min_separation
        assert nu is not None and parts is not None and sep is not None  # checked just above
        details = dpftrl.dpftrl_sensitivity_details(nu, self.steps, parts, sep, self.bands)
        object.__setattr__(self, "nu", float(nu))
        object.__setattr__(self, "participations", int(parts))
        object.__setattr__(self, "min_separation", int(sep))
        sens = details.value
        if self.sensitivity is not None:
            stored = self.sensitivity
            if not _is_real(stored) or not math.isfinite(stored) or stored <= 0:
                raise ValueError(f"sensitivity must be a finite number > 0, got {stored!r}")
            # a smaller stored value (tampering, or a ledger from a version with a looser
            # algorithm) never lowers the recomputed one; a larger one is kept (conservative)
            sens = max(sens, float(stored))
        object.__setattr__(self, "sensitivity", sens)

    @classmethod
    def nu_dpftrl(
        cls,
        noise_multiplier: float,
        steps: int,
        nu: float,
        participations: int,
        min_separation: int,
        bands: int | None = None,
    ) -> PrivacyEvent:
        """A ν-DP-FTRL run (see the class docstring); its sensitivity is computed."""
        return cls(
            noise_multiplier,
            1.0,
            steps,
            mechanism=NU_DPFTRL,
            nu=nu,
            bands=bands,
            participations=participations,
            min_separation=min_separation,
        )

    @classmethod
    def nu_dpftrl_prefix(
        cls,
        noise_multiplier: float,
        steps: int,
        nu: float,
        min_separation: int,
        bands: int | None = None,
    ) -> PrivacyEvent:
        """The first ``steps`` released steps of a ν-DP-FTRL run whose epochs are
        ``min_separation`` steps long: rows 1..steps of the same lower-triangular Toeplitz
        noise, i.e. a ν-DP-FTRL run of ``steps`` steps with at most ⌈steps / min_separation⌉
        participations per example. The one builder of a (partial) run's event: the planner,
        the runner and the service's budgets all use it."""
        return cls.nu_dpftrl(
            noise_multiplier,
            steps=steps,
            nu=nu,
            participations=-(-steps // min_separation),
            min_separation=min_separation,
            bands=bands,
        )

    @property
    def mu(self) -> float:
        """μ = sensitivity/σ of a ν-DP-FTRL event (the whole run is one Gaussian mechanism)."""
        if self.mechanism != NU_DPFTRL or self.sensitivity is None:
            raise ValueError("mu is defined for nu_dpftrl events only")
        return self.sensitivity / self.noise_multiplier

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.mechanism != NU_DPFTRL:
            for f in DPFTRL_FIELDS:
                del data[f]
        if self.sketch == SHARED_SKETCH:
            del data["sketch"]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyEvent:
        if not isinstance(data, dict):
            raise ValueError(f"an event must be a JSON object, got {type(data).__name__}")
        allowed = {"noise_multiplier", "sample_rate", "steps", "clipping", "k", "rank", "mechanism"}
        allowed |= set(DPFTRL_FIELDS) | {"sketch"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown event fields: {sorted(unknown)}")
        missing = {"noise_multiplier", "sample_rate", "steps"} - set(data)
        if missing:
            raise ValueError(f"event is missing fields: {sorted(missing)}")
        return cls(**data)
