"""Noise mechanisms as objects: what the engine is told to add, and the sampler that adds it.

``PrivacyEngine(..., noise_mechanism=Gaussian())`` (the default) adds independent
N(0, σ²C²) per coordinate once per logical batch; ``noise_mechanism=NuDPFTRL(nu=0.1,
bands=16)`` adds ν-DP-FTRL correlated noise (exact clipping only). The names ``"gaussian"`` and
``"nu_dpftrl"`` are the same in the engine, the runner, the API and the docs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from dprc_core.mechanism_names import GAUSSIAN, NOISE_MECHANISMS, NU_DPFTRL
from dprc_core.noise.gaussian import GaussianNoise
from dprc_core.noise.nu_dpftrl import NuDPFTRLNoise


@dataclass(frozen=True)
class Gaussian:
    """Independent Gaussian noise (DP-SGD)."""

    name: ClassVar[str] = GAUSSIAN
    exact_clipping_only: ClassVar[bool] = False

    def sampler(self, std: float) -> GaussianNoise:
        return GaussianNoise(std)


@dataclass(frozen=True)
class NuDPFTRL:
    """ν-DP-FTRL correlated noise with damping ``nu`` in [0, 1] and optional ``bands``."""

    nu: float
    bands: int | None = None
    name: ClassVar[str] = NU_DPFTRL
    exact_clipping_only: ClassVar[bool] = True

    def sampler(self, std: float) -> NuDPFTRLNoise:
        return NuDPFTRLNoise(std, self.nu, self.bands)


NoiseMechanism = Gaussian | NuDPFTRL


def as_noise_mechanism(
    value: Any, nu: float | None = None, bands: int | None = None
) -> NoiseMechanism:
    """A mechanism object from an object or a name; ``nu`` / ``bands`` beside the name
    ``"nu_dpftrl"`` are the deprecated spelling of ``NuDPFTRL(nu, bands)``."""
    if isinstance(value, (Gaussian, NuDPFTRL)):
        if nu is not None or bands is not None:
            raise ValueError("give nu and bands inside NuDPFTRL(nu=..., bands=...), not beside it")
        return value
    if value == Gaussian.name:
        if nu is not None or bands is not None:
            raise ValueError("nu and bands apply to noise_mechanism='nu_dpftrl' only")
        return Gaussian()
    if value == NuDPFTRL.name:
        if nu is None:
            raise ValueError("noise_mechanism='nu_dpftrl' needs nu (the damping, in [0, 1])")
        warnings.warn(
            "noise_mechanism='nu_dpftrl' with nu=/bands= beside it is deprecated; pass "
            "noise_mechanism=dprc_core.noise.NuDPFTRL(nu=..., bands=...)",
            DeprecationWarning,
            stacklevel=3,
        )
        return NuDPFTRL(nu, bands)
    raise ValueError(
        f"noise_mechanism must be one of {NOISE_MECHANISMS} (or a Gaussian / "
        f"NuDPFTRL object), got {value!r}"
    )
