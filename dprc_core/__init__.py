"""dprc_core: DP-SGD with randomized clipping (DP-SGD-RC) for language models.

The library never imports the ``api`` or ``worker`` packages.
"""

from dprc_core.engine import PrivacyEngine, StepStats, per_sample_grad_norms
from dprc_core.estimators import METHODS
from dprc_core.layers import UnsupportedModuleError, register

__all__ = [
    "METHODS",
    "PrivacyEngine",
    "StepStats",
    "UnsupportedModuleError",
    "per_sample_grad_norms",
    "register",
]
__version__ = "0.1.0"
