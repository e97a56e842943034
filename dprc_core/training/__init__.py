"""Training utilities: Poisson sampling and the end-to-end library demo.

``PoissonSampler`` is imported on first use (as ``dprc_core``'s own names): ``dprc train
--help`` and ``dprc --help`` parse without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dprc_core.training.sampling import PoissonSampler

__all__ = ["PoissonSampler"]


def __getattr__(name: str) -> Any:
    if name == "PoissonSampler":
        from dprc_core.training.sampling import PoissonSampler

        return PoissonSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
