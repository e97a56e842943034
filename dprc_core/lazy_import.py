"""A package's names imported on first use, as ``transformers`` does it: the module-level
``__getattr__`` and ``__dir__`` of ``dprc_core`` and ``dprc_core.accounting`` (so that
``import dprc_core`` loads no torch; tests/dprc/test_startup_imports.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, homes: dict[str, str], names: list[str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: a name of ``homes`` is imported from its
    submodule on first use and then kept in ``namespace`` (the package's globals); any other
    name is tried as a submodule, as an eager package's would be."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
            namespace[name] = value
            return value
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":  # a submodule that failed to import
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
