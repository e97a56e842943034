"""Noise mechanisms as objects: what the engine is told to add, and the sampler that adds it.

``PrivacyEngine(..., noise=Gaussian(σ))`` adds independent N(0, σ²C²) per coordinate once per
logical batch (``Gaussian(σ, secure=True)``: from a ChaCha20 keystream, docs/engine.md "Secure
mode"); ``noise=NuDPFTRL(σ, nu=0.1, bands=16)`` adds ν-DP-FTRL correlated noise (exact
clipping only, torch's generator only). The names ``"gaussian"`` and ``"nu_dpftrl"`` are the
same in the engine, the runner, the API and the docs.

``noise_multiplier`` may be left out only where the engine is given it separately: the
deprecated ``PrivacyEngine(..., noise_multiplier=σ, noise_mechanism=Gaussian())`` spelling.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from dprc_core.accounting.dpftrl import check_bands, check_nu
from dprc_core.mechanism_names import GAUSSIAN, NOISE_MECHANISMS, NU_DPFTRL
from dprc_core.noise.gaussian import GaussianNoise
from dprc_core.noise.nu_dpftrl import NuDPFTRLNoise


def check_noise_multiplier(value: Any) -> float:
    """σ: a finite number >= 0 (bools refused); σ = 0 adds no noise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value >= 0):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {value!r}")
    return float(value)


def _optional_sigma(obj: Any) -> None:
    if obj.noise_multiplier is not None:
        object.__setattr__(obj, "noise_multiplier", check_noise_multiplier(obj.noise_multiplier))


@dataclass(frozen=True)
class Gaussian:
    """Independent Gaussian noise N(0, σ²C²) per coordinate (DP-SGD) with noise multiplier
    ``noise_multiplier`` = σ; ``secure=True``: drawn from a ChaCha20 keystream keyed from the
    OS, as a float64 sum of normals (docs/engine.md, "Secure mode")."""

    noise_multiplier: float | None = None
    secure: bool = False
    name: ClassVar[str] = GAUSSIAN
    exact_clipping_only: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _optional_sigma(self)
        object.__setattr__(self, "secure", bool(self.secure))

    def sampler(self, std: float) -> GaussianNoise:
        """The torch-generator sampler (the engine builds the secure one itself)."""
        return GaussianNoise(std)

    def to_dict(self) -> dict[str, Any]:
        """This mechanism as a JSON object (:func:`noise_from_dict` reads it back)."""
        return {
            "mechanism": self.name,
            "noise_multiplier": self.noise_multiplier,
            "secure": self.secure,
        }


@dataclass(frozen=True)
class NuDPFTRL:
    """ν-DP-FTRL correlated noise: per-step std σ·C before correlation, damping ``nu`` in
    [0, 1] and optional ``bands`` (None: un-banded). Exact clipping only."""

    noise_multiplier: float | None = None
    nu: float | None = None
    bands: int | None = None
    name: ClassVar[str] = NU_DPFTRL
    exact_clipping_only: ClassVar[bool] = True
    secure: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _optional_sigma(self)
        if self.nu is None:
            raise ValueError("NuDPFTRL needs nu (the damping, in [0, 1])")
        object.__setattr__(self, "nu", check_nu(self.nu))
        object.__setattr__(self, "bands", check_bands(self.bands))

    def sampler(self, std: float) -> NuDPFTRLNoise:
        assert self.nu is not None  # checked on construction
        return NuDPFTRLNoise(std, self.nu, self.bands)

    def to_dict(self) -> dict[str, Any]:
        """This mechanism as a JSON object (:func:`noise_from_dict` reads it back)."""
        return {
            "mechanism": self.name,
            "noise_multiplier": self.noise_multiplier,
            "nu": self.nu,
            "bands": self.bands,
        }


NoiseMechanism = Gaussian | NuDPFTRL


def noise_from_dict(data: Any) -> NoiseMechanism:
    """The mechanism a ``to_dict`` object describes, by its ``mechanism`` name (unknown
    fields and invalid values refused with a ValueError)."""
    if not isinstance(data, dict):
        raise ValueError(f"a noise mechanism must be a JSON object, got {type(data).__name__}")
    fields = dict(data)
    name = fields.pop("mechanism", None)
    allowed = {
        Gaussian.name: {"noise_multiplier", "secure"},
        NuDPFTRL.name: {"noise_multiplier", "nu", "bands"},
    }
    if name not in allowed:
        raise ValueError(f"mechanism must be one of {sorted(allowed)}, got {name!r}")
    unknown = set(fields) - allowed[name]
    if unknown:
        raise ValueError(f"unknown {name} fields: {sorted(unknown)}")
    if name == Gaussian.name:
        return Gaussian(**fields)
    return NuDPFTRL(**fields)


def as_noise_mechanism(
    value: Any, nu: float | None = None, bands: int | None = None, *, warn: bool = True
) -> NoiseMechanism:
    """A mechanism object from an object or a name; ``nu`` / ``bands`` beside the name
    ``"nu_dpftrl"`` are the deprecated spelling of ``NuDPFTRL(nu=nu, bands=bands)`` (a
    DeprecationWarning unless ``warn=False``)."""
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
        if warn:
            warnings.warn(
                "noise_mechanism='nu_dpftrl' with nu=/bands= beside it is deprecated; pass "
                "noise=dprc_core.noise.NuDPFTRL(noise_multiplier, nu=..., bands=...)",
                DeprecationWarning,
                stacklevel=3,
            )
        return NuDPFTRL(nu=nu, bands=bands)
    raise ValueError(
        f"noise_mechanism must be one of {NOISE_MECHANISMS} (or a Gaussian / "
        f"NuDPFTRL object), got {value!r}"
    )
