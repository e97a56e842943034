"""dprc_core: DP-SGD with randomized clipping (DP-SGD-RC) for language models.

``PrivacyEngine(model, optimizer, clipping=Clipping(C, Hutch(k)), noise=Gaussian(σ),
expected_batch_size=q·N)``; ``engine.privacy_event(steps, q)`` is what the accountant counts.
The library never imports the ``api`` or ``worker`` packages.

The package imports its names lazily, as ``transformers`` does: ``import dprc_core`` (and
``import dprc_core.accounting``) loads no torch; ``from dprc_core import PrivacyEngine`` imports
the engine's module (and torch) when the name is first asked for (:data:`_LAZY` says where each
name lives). ``dprc --help``, the client's commands and ``dprc accountant`` start without torch
(tests/dprc/test_startup_imports.py, docs/benchmarks/client_startup.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dprc_core.lazy_import import lazy_names

if TYPE_CHECKING:  # the real imports, for type checkers and IDEs
    from dprc_core.clipping import Auto, Clipping, Exact, Hutch, HutchPP, Sketched
    from dprc_core.engine import PrivacyEngine, PrivacyWarning, StepStats, per_sample_grad_norms
    from dprc_core.independence import SampleMixingError
    from dprc_core.layers import LayerHandler, UnsupportedModuleError, register
    from dprc_core.noise import Gaussian, NuDPFTRL
    from dprc_core.norm_methods import NORM_METHODS, NormMethod, register_norm_method

# each public name -> the submodule it is imported from on first use
_LAZY: dict[str, str] = {
    **dict.fromkeys(("Auto", "Clipping", "Exact", "Hutch", "HutchPP", "Sketched"), "clipping"),
    **dict.fromkeys(
        ("PrivacyEngine", "PrivacyWarning", "StepStats", "per_sample_grad_norms"), "engine"
    ),
    "SampleMixingError": "independence",
    **dict.fromkeys(("LayerHandler", "UnsupportedModuleError", "register"), "layers"),
    **dict.fromkeys(("Gaussian", "NuDPFTRL"), "noise"),
    **dict.fromkeys(("NORM_METHODS", "NormMethod", "register_norm_method"), "norm_methods"),
}

__all__ = [
    "NORM_METHODS",
    "Auto",
    "Clipping",
    "Exact",
    "Gaussian",
    "Hutch",
    "HutchPP",
    "LayerHandler",
    "NormMethod",
    "NuDPFTRL",
    "PrivacyEngine",
    "PrivacyWarning",
    "SampleMixingError",
    "Sketched",
    "StepStats",
    "UnsupportedModuleError",
    "per_sample_grad_norms",
    "register",
    "register_norm_method",
]
__version__ = "0.1.0"  # a literal: pyproject.toml reads it with setuptools' attr:


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
