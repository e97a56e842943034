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

CLIPPINGS = ("exact", "hutch", "hutchpp")
SUPPORTED_MECHANISMS = ("dp-sgd",)
# Mechanisms that exist in the design but have no accountant yet: refused with a clear error
# rather than accounted as if they were DP-SGD.
PLANNED_MECHANISMS = ("nu-dp-ftrl",)


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
    if mechanism in SUPPORTED_MECHANISMS:
        return str(mechanism)
    if mechanism in PLANNED_MECHANISMS:
        raise UnsupportedMechanismError(
            f"mechanism {mechanism!r} is not supported by this accountant yet "
            f"(supported: {SUPPORTED_MECHANISMS}); refusing to account it as DP-SGD"
        )
    raise ValueError(f"unknown mechanism {mechanism!r}; supported: {SUPPORTED_MECHANISMS}")


@dataclass(frozen=True)
class PrivacyEvent:
    """``steps`` Poisson-subsampled (rate ``sample_rate``) DP-SGD steps with noise multiplier
    σ and the given clipping (``exact``, or randomized ``hutch`` / ``hutchpp`` with projection
    dimension ``k`` and optional total rank D for the Hutch rank-dependent envelope)."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    clipping: str = "exact"
    k: int | None = None
    rank: int | None = None
    mechanism: str = "dp-sgd"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mechanism", check_mechanism(self.mechanism))
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))
        clipping, k, rank = check_clipping(self.clipping, self.k, self.rank)
        object.__setattr__(self, "clipping", clipping)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "rank", rank)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyEvent:
        if not isinstance(data, dict):
            raise ValueError(f"an event must be a JSON object, got {type(data).__name__}")
        allowed = {"noise_multiplier", "sample_rate", "steps", "clipping", "k", "rank", "mechanism"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown event fields: {sorted(unknown)}")
        missing = {"noise_multiplier", "sample_rate", "steps"} - set(data)
        if missing:
            raise ValueError(f"event is missing fields: {sorted(missing)}")
        return cls(**data)
