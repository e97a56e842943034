"""Per-layer per-sample gradient handlers (one module per layer family)."""

from dprc_core.layers import embedding, linear, norms  # noqa: F401  (registration side effects)
from dprc_core.layers.base import (
    Contribution,
    LayerHandler,
    UnsupportedModuleError,
    handler_for,
    register,
    supported_types,
)

__all__ = [
    "Contribution",
    "LayerHandler",
    "UnsupportedModuleError",
    "handler_for",
    "register",
    "supported_types",
]
