"""Poisson sampling from the secure stream (secure mode).

Same batches as :class:`dprc_core.training.sampling.PoissonSampler` in law — each of the N
examples independently in each step's batch — but the randomness comes from ChaCha20
(:mod:`dprc_core.noise.secure_stream`) instead of ``torch.rand``: step t's batch is drawn by
geometric skips (:mod:`dprc_core.training.geometric_skips`, O(q·N) a step) from the 64-bit
words of stream t (key HMAC(root key, "sampling/0")), with the exact law of one coin per
example, each included with probability ⌊q·2⁶⁴⌋/2⁶⁴ ∈ (q − 2⁻⁶⁴, q]: never above the q the
accountant is given (ε is non-decreasing in q; docs/accounting.md §12).

The batch of step t depends on (key, t) only, so every rank that shares the root stream draws
the same batches, and iteration resumes from :attr:`step` (like
:class:`~dprc_core.training.sampling.FixedOrderSampler`). :meth:`state_dict` holds the
sampling key: SECRET (it reveals which examples were in which batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dprc_core.distributed import Ranks, shard_indices
from dprc_core.noise.secure_stream import STATE_VERSION, SecureStream
from dprc_core.training.geometric_skips import poisson_positions, rate_threshold


class StreamWords:
    """64-bit words of a secure stream, in order (a :class:`~dprc_core.training.geometric_skips.
    WordSource`)."""

    bits = 64

    def __init__(self, stream: SecureStream):
        self.stream = stream

    def draw(self, m: int) -> np.ndarray:
        return self.stream.words(m)


def secure_poisson_indices(stream: SecureStream, n: int, q: float) -> torch.Tensor:
    """One Poisson sample of [0, n) from ``stream``'s words (from its position): each index
    independently with probability ⌊q·2⁶⁴⌋/2⁶⁴ ≤ q, in O(q·n)."""
    return poisson_positions(n, rate_threshold(q, 64), StreamWords(stream))


class SecurePoissonSampler:
    """Yields the index tensors of steps ``step`` … ``steps − 1``; each index is included with
    probability ``sample_rate`` (rounded down to a multiple of 2⁻⁶⁴)."""

    def __init__(
        self,
        num_examples: int,
        sample_rate: float,
        steps: int,
        stream: SecureStream | None = None,
        ranks: Ranks | None = None,
    ):
        if isinstance(num_examples, bool) or not (
            isinstance(num_examples, int) and num_examples > 0
        ):
            raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
        if isinstance(sample_rate, bool) or not (
            isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1
        ):
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if isinstance(steps, bool) or not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        self.num_examples = num_examples
        self.sample_rate = float(sample_rate)
        self.steps = steps
        self.step = 0
        self.ranks = ranks or Ranks()  # several ranks: each yields its part (a shared stream)
        self._stream = (SecureStream() if stream is None else stream).derive("sampling")

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.num_examples

    def __len__(self) -> int:
        return self.steps

    def indices(self, step: int) -> torch.Tensor:
        """All example indices of ``step`` (int64, ascending), every rank's."""
        return secure_poisson_indices(self._stream.at(step), self.num_examples, self.sample_rate)

    def mask(self, step: int) -> torch.Tensor:
        """The inclusion mask (bool, N) of ``step`` (O(N): for inspection)."""
        mask = torch.zeros(self.num_examples, dtype=torch.bool)
        mask[self.indices(step)] = True
        return mask

    def batch(self, step: int) -> torch.Tensor:
        """The example indices of ``step`` (int64, ascending); this rank's part of them."""
        return shard_indices(self.indices(step), self.ranks)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while self.step < self.steps:
            batch = self.batch(self.step)
            self.step += 1
            yield batch

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Key, position and settings as flat tensors (safetensors-able). SECRET."""
        return {
            "meta.version": torch.tensor(STATE_VERSION, dtype=torch.int64),
            "meta.step": torch.tensor(self.step, dtype=torch.int64),
            "meta.steps": torch.tensor(self.steps, dtype=torch.int64),
            "meta.num_examples": torch.tensor(self.num_examples, dtype=torch.int64),
            "meta.sample_rate": torch.tensor(self.sample_rate, dtype=torch.float64),
            "key": self._stream.state_dict()["key"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; N, q and steps must match this sampler."""
        try:
            version = int(state["meta.version"])
            step, steps = int(state["meta.step"]), int(state["meta.steps"])
            n, q = int(state["meta.num_examples"]), float(state["meta.sample_rate"])
            key = bytes(torch.as_tensor(state["key"], dtype=torch.uint8).tolist())
        except KeyError as exc:
            raise ValueError(f"not a SecurePoissonSampler state: missing {exc}") from exc
        if version != STATE_VERSION:
            raise ValueError(f"unsupported SecurePoissonSampler state version {version}")
        if (n, q, steps) != (self.num_examples, self.sample_rate, self.steps):
            raise ValueError(
                f"state is for num_examples={n}, sample_rate={q}, steps={steps}; this sampler "
                f"has {self.num_examples}, {self.sample_rate}, {self.steps}"
            )
        if not 0 <= step <= steps:
            raise ValueError(f"step must be in [0, steps], got {step}")
        self._stream = SecureStream(key)
        self.step = step
