"""Validation of what a privacy event and the accountant's functions are given.

Every check returns the value normalised (a float, an int, a canonical name) or raises
``ValueError`` with a message naming the argument.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

from dprc_core.accounting.envelope import check_k, check_rank
from dprc_core.accounting.renamed_keywords import renamed_keyword

# the envelope families and the sketches (shared or per-example, docs/accounting.md §10):
# their one spelling is dprc_core.mechanism_names's, which imports nothing
from dprc_core.mechanism_names import (
    ENVELOPES,
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    SKETCHES,
    canonical_mechanism,
)

__all__ = [
    "ENVELOPES",
    "PER_EXAMPLE_SKETCH",
    "SHARED_SKETCH",
    "SKETCHES",
    "HIDDEN_SCALE_WIDTH",
    "LEGACY_HIDDEN_SCALE_WIDTH",
    "MAX_SCALE_WIDTH",
    "check_clipping",
    "recorded_scale_width",
    "check_delta",
    "check_envelope",
    "check_epsilon",
    "check_mechanism",
    "check_noise_multiplier",
    "check_sample_rate",
    "check_scale_width",
    "check_sketch",
    "check_steps",
]

# The hidden-scale model's scale law (per-example sketches, docs/accounting.md §10, "The scale
# law's width"): the relative width of its scale bins. Each hidden-scale event carries its own
# (SubsampledGaussianEvent.scale_width), so a job keeps the law it was planned and charged on:
# HIDDEN_SCALE_WIDTH (1 %) for events built now, LEGACY_HIDDEN_SCALE_WIDTH (0.1 %, the law of
# every hidden-scale event before the width was recorded) for one read without it. Any width
# is sound (each bin's mass sits at its upper edge); above MAX_SCALE_WIDTH (the grid's own
# coarse law) a width is refused.
HIDDEN_SCALE_WIDTH = 0.01
LEGACY_HIDDEN_SCALE_WIDTH = 0.001
MAX_SCALE_WIDTH = 0.05


def recorded_scale_width(fields: dict[str, Any]) -> float | None:
    """The scale law of a recorded event or plan (its JSON ``fields``): its ``scale_width``
    where recorded; else a per-example one was written before the law was recorded, so it was
    planned, charged and run on the legacy law (0.1 %) and keeps it; None for the others."""
    width = fields.get("scale_width")
    if width is None and fields.get("sketch", SHARED_SKETCH) == PER_EXAMPLE_SKETCH:
        return LEGACY_HIDDEN_SCALE_WIDTH
    return None if width is None else float(width)


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_noise_multiplier(sigma: Any) -> float:
    if not is_real(sigma) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {sigma!r}")
    return float(sigma)


def check_sample_rate(q: Any) -> float:
    if not is_real(q) or not math.isfinite(q) or not 0 < q <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {q!r}")
    return float(q)


def check_steps(steps: Any) -> int:
    if not is_int(steps) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    return int(steps)


def check_delta(delta: Any) -> float:
    if not is_real(delta) or not math.isfinite(delta) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon: Any) -> float:
    if not is_real(epsilon) or not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def check_envelope(envelope: Any, k: Any, rank: Any) -> tuple[str, int | None, int | None]:
    """Validate the accountant's envelope family (``exact``, or randomized ``hutch`` /
    ``hutchpp``) with its projection dimension k and total rank. The messages name the
    job's ``clipping``, the word users give it by."""
    if envelope not in ENVELOPES:
        raise ValueError(f"clipping must be one of {ENVELOPES}, got {envelope!r}")
    if envelope == "exact":
        if k is not None:
            raise ValueError("k is only meaningful for randomized clipping (hutch/hutchpp)")
        if rank is not None:
            raise ValueError("rank is only meaningful for randomized clipping (hutch/hutchpp)")
        return envelope, None, None
    if k is None:
        raise ValueError(f"clipping={envelope!r} needs the projection dimension k")
    if envelope == "hutchpp" and rank is not None:
        raise ValueError(
            "rank applies to clipping='hutch' only: Hutch++ is always accounted with the "
            "dimension-free envelope, so a rank would be ignored"
        )
    return envelope, check_k(k), check_rank(rank)


def check_clipping(clipping: Any, k: Any, rank: Any) -> tuple[str, int | None, int | None]:
    """Deprecated name of :func:`check_envelope`."""
    warnings.warn(
        "check_clipping is deprecated, use check_envelope", DeprecationWarning, stacklevel=2
    )
    return check_envelope(clipping, k, rank)


def check_mechanism(mechanism: Any) -> str:
    return canonical_mechanism(mechanism)


def check_scale_width(width: Any) -> float:
    """A hidden-scale law's relative bin width: a finite number in (0, MAX_SCALE_WIDTH]."""
    if not is_real(width) or not math.isfinite(width) or not 0 < width <= MAX_SCALE_WIDTH:
        raise ValueError(
            f"scale_width must be a finite number with 0 < scale_width <= {MAX_SCALE_WIDTH} "
            f"(the relative width of the hidden-scale law's bins), got {width!r}"
        )
    return float(width)


@renamed_keyword("clipping", "envelope")
def check_sketch(sketch: Any, envelope: str, *, clipping: str | None = None) -> str:
    """Validate how the sketch was drawn; ``per_example`` needs a randomized envelope."""
    if sketch not in SKETCHES:
        raise ValueError(f"sketch must be one of {SKETCHES}, got {sketch!r}")
    if sketch == PER_EXAMPLE_SKETCH and envelope == "exact":
        raise ValueError(
            "sketch='per_example' applies to randomized clipping (hutch/hutchpp) only: exact "
            "norms draw no sketch"
        )
    return str(sketch)
