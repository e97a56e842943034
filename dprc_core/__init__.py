"""dprc_core: DP-SGD with randomized clipping (DP-SGD-RC) for language models.

The library never imports the ``api`` or ``worker`` packages.
"""

from dprc_core.engine import PrivacyEngine, PrivacyWarning, StepStats, per_sample_grad_norms
from dprc_core.independence import SampleMixingError
from dprc_core.layers import LayerHandler, UnsupportedModuleError, register
from dprc_core.norm_methods import NORM_METHODS, NormMethod, register_norm_method

__all__ = [
    "NORM_METHODS",
    "NormMethod",
    "LayerHandler",
    "PrivacyEngine",
    "PrivacyWarning",
    "SampleMixingError",
    "StepStats",
    "UnsupportedModuleError",
    "per_sample_grad_norms",
    "register",
    "register_norm_method",
]
__version__ = "0.1.0"
