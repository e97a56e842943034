"""Poisson sampling: the sampling the accountant assumes (DESIGN.md §4).

Every logical batch includes each of the N examples independently with probability q, so the
batch size is Binomial(N, q) — possibly 0, which is still a (noise-only) step. Divide by the
*expected* batch size q·N, never by the realised one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch


class PoissonSampler:
    """Yields ``steps`` index tensors; each index is included with probability ``sample_rate``."""

    def __init__(self, num_examples: int, sample_rate: float, steps: int, seed: int | None = None):
        if not (isinstance(num_examples, int) and num_examples > 0):
            raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
        if not (0 < sample_rate <= 1):
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        self.num_examples = num_examples
        self.sample_rate = float(sample_rate)
        self.steps = steps
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.num_examples

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.steps):
            draws = torch.rand(self.num_examples, generator=self.generator)
            yield torch.nonzero(draws < self.sample_rate).flatten()
