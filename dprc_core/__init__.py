"""dprc_core: DP-SGD with randomized clipping (DP-SGD-RC) for language models.

``PrivacyEngine(model, optimizer, clipping=Clipping(C, Hutch(k)), noise=Gaussian(σ),
expected_batch_size=q·N)``; ``engine.privacy_event(steps, q)`` is what the accountant counts.
The library never imports the ``api`` or ``worker`` packages.
"""

from dprc_core.clipping import Auto, Clipping, Exact, Hutch, HutchPP, Sketched
from dprc_core.engine import PrivacyEngine, PrivacyWarning, StepStats, per_sample_grad_norms
from dprc_core.independence import SampleMixingError
from dprc_core.layers import LayerHandler, UnsupportedModuleError, register
from dprc_core.noise import Gaussian, NuDPFTRL
from dprc_core.norm_methods import NORM_METHODS, NormMethod, register_norm_method

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
__version__ = "0.1.0"
