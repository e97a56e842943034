"""Noise mechanisms added to the clipped gradient sum once per logical batch."""

from dprc_core.mechanism_names import NOISE_MECHANISMS, canonical_mechanism
from dprc_core.noise.gaussian import GaussianNoise
from dprc_core.noise.mechanisms import (
    Gaussian,
    NoiseMechanism,
    NuDPFTRL,
    as_noise_mechanism,
    noise_from_dict,
)
from dprc_core.noise.nu_dpftrl import NuDPFTRLNoise
from dprc_core.noise.secure_gaussian import SecureGaussianNoise
from dprc_core.noise.secure_stream import SecureStream

__all__ = [
    "NOISE_MECHANISMS",
    "Gaussian",
    "GaussianNoise",
    "NoiseMechanism",
    "NuDPFTRL",
    "NuDPFTRLNoise",
    "SecureGaussianNoise",
    "SecureStream",
    "as_noise_mechanism",
    "canonical_mechanism",
    "noise_from_dict",
]
