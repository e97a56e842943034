"""The layer registry: one handler per layer family, registered by module type.

A handler turns one call of a module — what the forward saw (``capture``) and the gradient of
the loss with respect to the module's output (``contributions``) — into per-sample gradient
contributions for each of the module's trainable parameters. The engine knows no layer math.
Adding a layer type means adding one module with a ``register(ModuleType)(handler)`` call.

Lookup is strict, because a handler encodes the math of one ``forward``: a module is handled by
the handler registered for its exact type, or by the handler of a registered base class only
when no class between the two overrides ``forward`` (``class Scaled(nn.Linear)`` with its own
``forward`` is *not* a Linear for dprc). Failing that, a *fallback* handler may claim the
module by its structure (``register_fallback``): fallbacks read the module's math off its own
forward and verify it (see :mod:`dprc_core.layers.probing`), refusing what they cannot
reproduce. Anything else is refused at engine construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from dprc_core.estimators import MatrixContribution

# A contribution is either a MatrixContribution (2-D parameter) or a per-sample gradient
# tensor (B, n) for a 1-D parameter.
Contribution = MatrixContribution | torch.Tensor


class UnsupportedModuleError(TypeError):
    """A module with trainable parameters has no per-sample gradient handler."""


# The module family a handler serves (``nn.Linear`` for the Linear handler, ...).
_ModuleT = TypeVar("_ModuleT", bound=nn.Module)


@dataclass
class LayerHandler(Generic[_ModuleT]):
    """How to compute per-sample gradient contributions for one module family."""

    # (module, positional inputs, output) -> saved state (kept until the backward)
    capture: Callable[[_ModuleT, tuple[Any, ...], torch.Tensor], Any]
    # (module, saved state, grad of output reshaped to (B, T, out)) -> {param name: contribution}
    contributions: Callable[[_ModuleT, Any, torch.Tensor], dict[str, Contribution]]
    # (module) -> None or raise with a clear message (unsupported configuration)
    check: Callable[[_ModuleT], None] = lambda module: None
    # names of the module's own parameters the handler computes gradients for; a trainable
    # parameter outside this set (e.g. weight_norm's ``weight_g``) is refused
    params: tuple[str, ...] = ("weight", "bias")
    # the left factor of every weight contribution is a one-hot (embedding-style) matrix
    one_hot: bool = False
    # ``capture`` takes the forward's keyword arguments as a fourth argument
    capture_kwargs: bool = False


# The registries hold handlers of every module family: LayerHandler[Any].
_REGISTRY: dict[type, LayerHandler[Any]] = {}
# (predicate, handler): tried in order when no registered handler applies
_FALLBACKS: list[tuple[Callable[[nn.Module], bool], LayerHandler[Any]]] = []
# Handlers for classes of optional packages (transformers), keyed by "module.QualName" so that
# registering them imports nothing; matched by exact type only.
_NAMED: dict[str, LayerHandler[Any]] = {}


def register(*module_types: type) -> Callable[[LayerHandler[Any]], LayerHandler[Any]]:
    """Register a handler for the given module types.

    The handler serves exactly these types, and subclasses of them that do not override
    ``forward`` (see the module docstring).
    """

    def deco(handler: LayerHandler[Any]) -> LayerHandler[Any]:
        for t in module_types:
            _REGISTRY[t] = handler
        return handler

    return deco


def register_by_name(*qualified_names: str) -> Callable[[LayerHandler[Any]], LayerHandler[Any]]:
    """Register a handler for classes named ``"package.module.ClassName"`` (exact type only),
    without importing them."""

    def deco(handler: LayerHandler[Any]) -> LayerHandler[Any]:
        for name in qualified_names:
            _NAMED[name] = handler
        return handler

    return deco


def register_fallback(
    applies: Callable[[nn.Module], bool],
) -> Callable[[LayerHandler[Any]], LayerHandler[Any]]:
    """Register a handler for modules no registered handler serves, chosen by ``applies``.
    Its ``check`` must verify, at construction, that the module's forward has the math the
    handler differentiates, and refuse it otherwise."""

    def deco(handler: LayerHandler[Any]) -> LayerHandler[Any]:
        _FALLBACKS.append((applies, handler))
        return handler

    return deco


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def handler_for(module: nn.Module) -> LayerHandler[Any] | None:
    """The handler for ``module``'s exact type, or for the nearest registered base class when
    no class in between defines its own ``forward``; ``None`` otherwise."""
    named = _NAMED.get(_qualified_name(type(module)))
    if named is not None:
        return named
    for cls in type(module).__mro__:
        handler = _REGISTRY.get(cls)
        if handler is not None:
            return handler
        if "forward" in vars(cls):
            break  # this class has its own forward: a base class's math does not apply
    for applies, handler in _FALLBACKS:
        if applies(module):
            return handler
    return None


def is_fallback(handler: LayerHandler[Any]) -> bool:
    return any(h is handler for _, h in _FALLBACKS)


def handler_for_type(cls: type) -> LayerHandler[Any] | None:
    """The handler registered for exactly ``cls`` (by type or by name)."""
    return _REGISTRY.get(cls) or _NAMED.get(_qualified_name(cls))


def overriding_class(module: nn.Module) -> type | None:
    """The class whose own ``forward`` keeps ``module`` from a registered base's handler."""
    for cls in type(module).__mro__:
        if cls in _REGISTRY:
            return None
        if "forward" in vars(cls) and any(
            issubclass(cls, base) for base in _REGISTRY if base is not cls
        ):
            return cls
    return None


def supported_types() -> list[str]:
    return sorted({t.__name__ for t in _REGISTRY} | {n.rsplit(".", 1)[1] for n in _NAMED})


def as_sequence(x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """View a batch-first tensor (B, ..., n) as (B, T, n) with T the product of middle dims."""
    if x.dim() == 1:
        raise ValueError("expected a batched input with a feature dimension, got a 1-D tensor")
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.reshape(x.shape[0], -1, x.shape[-1])
