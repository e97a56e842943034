"""Noise mechanisms added to the clipped gradient sum once per logical batch."""

from dprc_core.mechanism_names import NOISE_MECHANISMS, canonical_mechanism
from dprc_core.noise.gaussian import GaussianNoise
from dprc_core.noise.mechanisms import Gaussian, NoiseMechanism, NuDPFTRL, as_noise_mechanism
from dprc_core.noise.nu_dpftrl import NuDPFTRLNoise

__all__ = [
    "NOISE_MECHANISMS",
    "Gaussian",
    "GaussianNoise",
    "NoiseMechanism",
    "NuDPFTRL",
    "NuDPFTRLNoise",
    "as_noise_mechanism",
    "canonical_mechanism",
]
