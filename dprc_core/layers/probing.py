"""Running a module's own ``forward`` with some of its parameters replaced, to read its math off
the module instead of copying each class's code (hooks bypassed, no autograd).

Handlers that recognise a layer this way then *verify* it: the formula they will differentiate
must reproduce the module's real output, or the module is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def _swapped(module: nn.Module, tensors: dict[str, torch.Tensor | None]) -> Iterator[None]:
    saved = {name: module._parameters[name] for name in tensors}
    try:
        for name, value in tensors.items():
            # a plain tensor stands in for the parameter while the probe runs (restored below)
            module._parameters[name] = value  # type: ignore[assignment]
        yield
    finally:
        for name, value in saved.items():
            module._parameters[name] = value


def own_forward(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    **tensors: torch.Tensor | None,
) -> Any:
    """``type(module).forward(module, *args, **kwargs)`` with the named parameters replaced by
    ``tensors``; no hooks of ``module`` run and nothing is recorded by autograd."""
    with torch.no_grad(), _swapped(module, tensors):
        return type(module).forward(module, *args, **(kwargs or {}))


def is_leaf(module: nn.Module) -> bool:
    return next(module.children(), None) is None


def probe_input(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0
) -> torch.Tensor:
    """A fixed, generic input (mean 0.5, sd 2): no symmetry a formula could hide behind."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(
        dtype=dtype, device=device
    )


def rounding(dtype: torch.dtype) -> float:
    """A few rounding units of ``dtype`` (float64 results may carry float32 internal steps)."""
    if dtype == torch.float64:
        return 8 * torch.finfo(torch.float32).eps
    return 4 * torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def reproduces(actual: Any, expected: torch.Tensor, scale: torch.Tensor, tol: float) -> bool:
    """``actual`` equals ``expected`` elementwise within ``tol · scale`` (same shape)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return False
    diff = (actual.detach().double() - expected.double()).abs()
    return bool((diff <= tol * scale.double() + 1e-300).all())
