"""The norm-method registry: every way of computing per-sample gradient norms, in one table.

A norm method is one entry: its name, whether its estimate is randomized (then the accountant
must cover it with a randomized-clipping envelope, and k ≥ 2), the accountant's envelope family
it needs (``exact``, ``hutch`` or ``hutchpp``), and the estimator that turns a 2-D parameter's
factor contributions into per-sample squared norms. The engine, the planner, the runner, the
accountant's event validation and the API all read this table; adding a method is one
:func:`register_norm_method` call (see docs/engine.md).

Two entries dispatch instead of estimating: ``exact`` picks ``fgc`` or ``ghost`` per
parameter by cost (fastDP's rule), and ``auto`` picks exact or ``hutch`` per parameter once, for
the engine's ``max_seq_len``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dprc_core.estimators import (
    MatrixContribution,
    ProjectionSource,
    auto_choice,
    exact_choice,
    fgc_sq_norms,
    ghost_sq_norms,
    hutch_sq_norms,
    hutchpp_sq_norms,
)

# The accountant's envelope families, weakest first: a plan that mixes methods is accounted
# with the strongest family among them (docs/design.md §4). Defined in dprc_core.mechanism_names
# (which imports nothing, so the accountant reads it without torch).
from dprc_core.mechanism_names import ENVELOPES

# (contributions, k, projection source, dtype) -> (B,) per-sample squared norms
Estimator = Callable[
    [Sequence[MatrixContribution], int, ProjectionSource, torch.dtype], torch.Tensor
]


@dataclass(frozen=True)
class NormMethod:
    name: str
    randomized: bool  # the norm is a random estimate (needs k >= 2 and a randomized envelope)
    envelope: str  # the accountant's family that covers it: exact | hutch | hutchpp
    estimate: Estimator | None  # None: a dispatcher (exact, auto) resolved per parameter
    # offered by name to service users (privacy.clipping.method); fgc and ghost are what
    # ``exact`` picks between, so the service offers ``exact`` alone
    offered: bool = True


NORM_METHODS: dict[str, NormMethod] = {}


def register_norm_method(method: NormMethod) -> NormMethod:
    if method.envelope not in ENVELOPES:
        raise ValueError(f"envelope must be one of {ENVELOPES}, got {method.envelope!r}")
    NORM_METHODS[method.name] = method
    return method


def get_norm_method(name: str) -> NormMethod:
    try:
        return NORM_METHODS[name]
    except KeyError:
        raise ValueError(
            f"unknown norm method {name!r}; expected one of {tuple(NORM_METHODS)}"
        ) from None


def method_names() -> tuple[str, ...]:
    return tuple(NORM_METHODS)


def offered_names() -> tuple[str, ...]:
    return tuple(n for n, m in NORM_METHODS.items() if m.offered)


def randomized_names() -> tuple[str, ...]:
    return tuple(n for n, m in NORM_METHODS.items() if m.randomized)


def envelope_for(methods: set[str] | list[str] | tuple[str, ...]) -> str:
    """The accountant's family covering every method used (the strongest envelope among them)."""
    rank = max((ENVELOPES.index(get_norm_method(m).envelope) for m in methods), default=0)
    return ENVELOPES[rank]


def _exact(fn: Callable[[Sequence[MatrixContribution], torch.dtype], torch.Tensor]) -> Estimator:
    return lambda contribs, k, generator, dtype: fn(contribs, dtype)


def _sketch(fn: Callable[..., torch.Tensor]) -> Estimator:
    return lambda contribs, k, generator, dtype: fn(contribs, k, generator=generator, dtype=dtype)


register_norm_method(NormMethod("fgc", False, "exact", _exact(fgc_sq_norms), offered=False))
register_norm_method(NormMethod("ghost", False, "exact", _exact(ghost_sq_norms), offered=False))
register_norm_method(NormMethod("exact", False, "exact", None))
register_norm_method(NormMethod("hutch", True, "hutch", _sketch(hutch_sq_norms)))
register_norm_method(NormMethod("hutchpp", True, "hutchpp", _sketch(hutchpp_sq_norms)))
# auto resolves to an exact method or hutch per parameter: accounted as hutch if any is hutch
register_norm_method(NormMethod("auto", True, "hutch", None))


def matrix_sq_norms(
    contribs: Sequence[MatrixContribution],
    method: str,
    *,
    k: int,
    generator: ProjectionSource,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, str]:
    """Per-sample squared norms of a 2-D parameter's summed gradient; returns (norms², the
    method that ran: dispatchers resolve to an estimating entry)."""
    if method == "auto":
        method = auto_choice(contribs, k)
    if method == "exact":
        method = exact_choice(contribs)
    estimate = get_norm_method(method).estimate
    if estimate is None:
        raise ValueError(f"norm method {method!r} does not resolve to an estimator")
    return estimate(contribs, k, generator, dtype), method
