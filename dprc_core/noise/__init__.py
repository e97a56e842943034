"""Noise mechanisms added to the clipped gradient sum once per logical batch."""

from dprc_core.noise.gaussian import GaussianNoise

__all__ = ["GaussianNoise"]
