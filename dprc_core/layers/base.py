"""The layer registry: one handler per layer family, registered by module type.

A handler turns one call of a module — what the forward saw (``capture``) and the gradient of
the loss with respect to the module's output (``contributions``) — into per-sample gradient
contributions for each of the module's trainable parameters. The engine knows no layer math.
Adding a layer type means adding one module with a ``@register(ModuleType)`` handler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dprc_core.estimators import MatrixContribution

# A contribution is either a MatrixContribution (2-D parameter) or a per-sample gradient
# tensor (B, n) for a 1-D parameter.
Contribution = MatrixContribution | torch.Tensor


class UnsupportedModuleError(TypeError):
    """A module with trainable parameters has no per-sample gradient handler."""


@dataclass
class LayerHandler:
    """How to compute per-sample gradient contributions for one module family."""

    # (module, positional inputs, output) -> saved state (kept until the backward)
    capture: Callable[[nn.Module, tuple[Any, ...], torch.Tensor], Any]
    # (module, saved state, grad of output reshaped to (B, T, out)) -> {param name: contribution}
    contributions: Callable[[nn.Module, Any, torch.Tensor], dict[str, Contribution]]
    # (module) -> None or raise with a clear message (unsupported configuration)
    check: Callable[[nn.Module], None] = lambda module: None


_REGISTRY: dict[type, LayerHandler] = {}


def register(*module_types: type) -> Callable[[LayerHandler], LayerHandler]:
    """Register a handler for the given module types (exact type match, then subclasses)."""

    def deco(handler: LayerHandler) -> LayerHandler:
        for t in module_types:
            _REGISTRY[t] = handler
        return handler

    return deco


def handler_for(module: nn.Module) -> LayerHandler | None:
    handler = _REGISTRY.get(type(module))
    if handler is not None:
        return handler
    for t, h in _REGISTRY.items():
        if isinstance(module, t):
            return h
    return None


def supported_types() -> list[str]:
    return sorted({t.__name__ for t in _REGISTRY})


def as_sequence(x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """View a batch-first tensor (B, ..., n) as (B, T, n) with T the product of middle dims."""
    if x.dim() == 1:
        raise ValueError("expected a batched input with a feature dimension, got a 1-D tensor")
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.reshape(x.shape[0], -1, x.shape[-1])
