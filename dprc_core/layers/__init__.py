"""Per-layer per-sample gradient handlers (one module per layer family)."""

from dprc_core.layers import (  # noqa: F401  (registration side effects)
    embedding,
    linear,
    normalization,
    scaled_embedding,
)
from dprc_core.layers.base import (
    Contribution,
    LayerHandler,
    UnsupportedModuleError,
    handler_for,
    register,
    register_by_name,
    register_fallback,
    supported_types,
)

__all__ = [
    "Contribution",
    "LayerHandler",
    "UnsupportedModuleError",
    "handler_for",
    "register",
    "register_by_name",
    "register_fallback",
    "supported_types",
]
