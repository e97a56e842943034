"""Poisson sampling (DP-SGD) and fixed-order batches (ν-DP-FTRL): the samplings the accountant
assumes (docs/design.md §4).

Poisson sampling: every logical batch includes each of the N examples independently with
probability q, so the batch size is Binomial(N, q) — possibly 0, which is still a (noise-only)
step. Divide by the *expected* batch size q·N, never by the realised one. Fixed-order batches:
see :class:`FixedOrderSampler`.

A step costs O(q·N), not O(N): the batch is drawn by geometric skips
(:mod:`dprc_core.training.geometric_skips`), which has exactly the law of one coin per example,
each included with probability ⌊q·2⁵³⌋/2⁵³ ≤ q — never above the rate the accountant is given
(docs/accounting.md §12). The words come from torch's CPU generator (53-bit uniforms).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import torch

from dprc_core.distributed import Ranks, broadcast_int, check_same_on_all_ranks, shard_indices
from dprc_core.training.geometric_skips import TorchWords, poisson_positions, rate_threshold


def inclusion_threshold(q: float) -> float:
    """⌊q·2⁵³⌋/2⁵³ (exact): the probability with which each example is included (≤ q)."""
    return rate_threshold(q, 53) / (1 << 53)


def poisson_indices(n: int, q: float, generator: torch.Generator) -> torch.Tensor:
    """The indices in [0, n) of one Poisson sample: each independently with probability
    ⌊q·2⁵³⌋/2⁵³ ≤ q, in O(q·n) time and memory (geometric skips from ``generator``)."""
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    return poisson_positions(n, rate_threshold(q, 53), TorchWords(generator))


def _shared_seed(seed: int | None, ranks: Ranks) -> int:
    """The sampler's seed, rank 0's on every rank (an explicit seed must agree everywhere)."""
    explicit = seed is not None
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    if not ranks.distributed:
        return seed
    if explicit:  # a digest, not the secret seed, is compared
        digest = hashlib.sha256(f"dprc/sampler-seed/{seed}".encode()).hexdigest()[:16]
        check_same_on_all_ranks("the sampler's seed", digest, ranks)
    return broadcast_int(seed, ranks)


class PoissonSampler:
    """Yields ``steps`` index tensors; each index is included with probability ``sample_rate``.

    With ``ranks`` (several processes), every rank draws the same logical batch from the one
    shared seed and yields only its part (:func:`dprc_core.distributed.shard_indices`): the
    parts are disjoint, their union is the batch a single process would draw with that seed,
    and every rank yields every step (an empty part included)."""

    def __init__(
        self,
        num_examples: int,
        sample_rate: float,
        steps: int,
        seed: int | None = None,
        ranks: Ranks | None = None,
    ):
        if not (isinstance(num_examples, int) and num_examples > 0):
            raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
        if not (0 < sample_rate <= 1):
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        self.num_examples = num_examples
        self.sample_rate = float(sample_rate)
        self.steps = steps
        self.ranks = ranks or Ranks()
        self.generator = torch.Generator().manual_seed(_shared_seed(seed, self.ranks))

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.num_examples

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.steps):
            batch = poisson_indices(self.num_examples, self.sample_rate, self.generator)
            yield shard_indices(batch, self.ranks)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator's state (safetensors-able): iterating after :meth:`load_state_dict`
        draws the batches that would have followed. PRIVATE: it reveals the batches."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from a :meth:`state_dict`."""
        if set(state) != {"generator"}:
            raise ValueError(f"not a PoissonSampler state: keys {sorted(state)}")
        self.generator.set_state(state["generator"])


class FixedOrderSampler:
    """Fixed-order batches for ν-DP-FTRL (docs/design.md §4): shuffle once with ``seed``, then
    cycle through the same order every epoch — every example exactly once per epoch.

    With N examples and batch size B there are ``steps_per_epoch = ⌈N/B⌉`` batches per epoch;
    batch j of every epoch holds positions [j·B, (j+1)·B) of the shuffled order. When B does
    not divide N the **last batch of every epoch is smaller** (N − (⌈N/B⌉−1)·B examples):
    nothing is dropped or wrapped, so an example in batch j takes part in steps j, j + s,
    j + 2s, … (s = steps_per_epoch) — separated by exactly s — and at most ⌈steps/s⌉ times.
    :meth:`accounting_pattern` returns exactly these bounds for
    :func:`dprc_core.accounting.dpftrl_sensitivity`, which maximises over *every* pattern with
    at most that many participations at least s apart (a superset of the real ones, hence
    pessimistic). Divide the clipped sum by the fixed ``batch_size``, never by the realised
    size of the short batch. Reshuffling between epochs would break the separation and is not
    offered.

    Iteration resumes from :attr:`step`; :meth:`state_dict` is JSON-able (it holds the seed:
    PRIVATE, like every sampler's state).
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        *,
        epochs: int | None = None,
        steps: int | None = None,
        seed: int | None = None,
        ranks: Ranks | None = None,
    ):
        if not (isinstance(num_examples, int) and num_examples > 0):
            raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
        if not (isinstance(batch_size, int) and 0 < batch_size <= num_examples):
            raise ValueError(
                f"batch_size must be an integer in [1, num_examples], got {batch_size!r}"
            )
        if (epochs is None) == (steps is None):
            raise ValueError("give exactly one of epochs and steps")
        spe = -(-num_examples // batch_size)
        if epochs is not None:
            if not (isinstance(epochs, int) and epochs >= 1):
                raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
            steps = epochs * spe
        if not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        if seed is not None and not (isinstance(seed, int) and 0 <= seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        self.ranks = ranks or Ranks()
        seed = _shared_seed(seed, self.ranks)
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.steps = steps
        self.seed = seed
        self.steps_per_epoch = spe
        self.step = 0
        self.order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.steps

    def batch(self, step: int) -> torch.Tensor:
        """Example indices of ``step`` (0-based)."""
        j = step % self.steps_per_epoch
        whole = self.order[j * self.batch_size : (j + 1) * self.batch_size]
        return shard_indices(whole, self.ranks)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while self.step < self.steps:
            batch = self.batch(self.step)
            self.step += 1
            yield batch

    def accounting_pattern(self) -> dict[str, int]:
        """``steps``, ``participations`` (max per example) and ``min_separation`` of this
        sampler, the arguments :func:`dprc_core.accounting.dpftrl_sensitivity` needs."""
        return {
            "steps": self.steps,
            "participations": -(-self.steps // self.steps_per_epoch),
            "min_separation": self.steps_per_epoch,
        }

    def state_dict(self) -> dict[str, int]:
        return {
            "num_examples": self.num_examples,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "seed": self.seed,
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict` (its seed's order, at its step); N, the batch size
        and the steps must match this sampler."""
        saved = FixedOrderSampler.from_state_dict(state, self.ranks)
        if (saved.num_examples, saved.batch_size, saved.steps) != (
            self.num_examples,
            self.batch_size,
            self.steps,
        ):
            raise ValueError(
                f"state is for num_examples={saved.num_examples}, batch_size={saved.batch_size}, "
                f"steps={saved.steps}; this sampler has {self.num_examples}, {self.batch_size}, "
                f"{self.steps}"
            )
        self.seed, self.order, self.step = saved.seed, saved.order, saved.step

    @classmethod
    def from_state_dict(
        cls, state: dict[str, int], ranks: Ranks | None = None
    ) -> FixedOrderSampler:
        """Rebuild a sampler (same order) positioned at the saved step."""
        try:
            sampler = cls(
                state["num_examples"],
                state["batch_size"],
                steps=state["steps"],
                seed=state["seed"],
                ranks=ranks,
            )
            step = state["step"]
        except KeyError as exc:
            raise ValueError(f"not a FixedOrderSampler state: missing {exc}") from exc
        if not (isinstance(step, int) and 0 <= step <= sampler.steps):
            raise ValueError(f"step must be an integer in [0, steps], got {step!r}")
        sampler.step = step
        return sampler
