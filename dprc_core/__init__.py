"""dprc_core: DP-SGD with randomized clipping (DP-SGD-RC) for language models.

The library never imports the ``api`` or ``worker`` packages.
"""

from dprc_core.engine import PrivacyEngine, PrivacyWarning, StepStats, per_sample_grad_norms
from dprc_core.estimators import METHODS
from dprc_core.independence import SampleMixingError
from dprc_core.layers import LayerHandler, UnsupportedModuleError, register

__all__ = [
    "METHODS",
    "LayerHandler",
    "PrivacyEngine",
    "PrivacyWarning",
    "SampleMixingError",
    "StepStats",
    "UnsupportedModuleError",
    "per_sample_grad_norms",
    "register",
]
__version__ = "0.1.0"
