"""Seeds of the generators that draw a DP run's secret randomness (noise, projections, batches).

A user seed is never used as a torch seed directly: ``torch.manual_seed(seed)`` is how people
initialise models, and a noise generator seeded with the same integer would draw the very
numbers that built the initial weights, so the noise would be a function of the (often public)
initialisation. Every stream is instead seeded with SHA-256(tag, user seed, index), a different
63-bit value per purpose. That removes accidental correlation; it does not make a known seed
safe: whoever knows the seed can regenerate the noise and the batches. Keep a fixed seed as
secret as the data, or leave it ``None`` (63 bits from ``os.urandom``). In secure mode
(``secure_rng=True``, the service's default) the noise and the batches come from an OS-keyed
ChaCha20 stream instead (:mod:`dprc_core.noise.secure_stream`) and a seed only drives the
sketches' projections.
"""

from __future__ import annotations

import hashlib
import os


def fresh_seed() -> int:
    """63 bits from the operating system's CSPRNG."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def derive_seed(seed: int, purpose: str, index: int = 0) -> int:
    """The 63-bit torch seed of stream ``purpose`` (``index``: e.g. the device) for ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    digest = hashlib.sha256(f"dprc/{purpose}/{index}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
