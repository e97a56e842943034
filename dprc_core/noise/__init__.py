"""Noise mechanisms added to the clipped gradient sum once per logical batch."""

from dprc_core.noise.gaussian import GaussianNoise
from dprc_core.noise.nu_dpftrl import NuDPFTRLNoise

__all__ = ["GaussianNoise", "NuDPFTRLNoise"]
