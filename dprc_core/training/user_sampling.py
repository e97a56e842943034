"""Poisson sampling of users (user-level DP, docs/privacy_unit.md).

Each step includes each of the U users independently with probability q — drawn as
example-level sampling draws examples (:func:`sampling.poisson_indices`: geometric skips, O(q·U)
a step, each user with probability ⌊q·2⁵³⌋/2⁵³), so a user's inclusion probability never
exceeds the accounted q — and each included user contributes
at most ``max_examples_per_user`` (m) of its examples, chosen uniformly at random without
replacement, afresh at every step (all of them when it has m or fewer). The engine clips the
user's summed gradient over those rows to C (``PrivacyEngine.accumulate(..., user_ids=)``); the
accountant counts the step as a subsampled Gaussian with the users' rate q and N = U.

A step's rows come grouped by user (each user's rows contiguous, users in increasing order of
their position), so micro-batches can be cut between users (:func:`user_micro_batches`). With
several ranks every rank draws the same users and the same choices from the one shared seed
and keeps the users of its part (:func:`dprc_core.distributed.shard_indices` over user
positions): a user's rows are never split across ranks.

Secure mode (:class:`SecureUserPoissonSampler`): the users' inclusion coins come from the
ChaCha20 stream, exactly as :class:`~dprc_core.training.secure_sampling.SecurePoissonSampler`
draws examples (geometric skips over the words of stream t, each user with probability
⌊q·2⁶⁴⌋/2⁶⁴). Which m lines a
sampled user contributes stays on torch's generator: that choice is not part of the privacy
analysis (whatever lines are chosen, the user's clipped contribution has norm at most C), so
predicting it tells an adversary nothing the guarantee does not already allow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dprc_core.distributed import Ranks, owned
from dprc_core.noise.secure_stream import STATE_VERSION, SecureStream
from dprc_core.training.sampling import _shared_seed, poisson_indices
from dprc_core.training.secure_sampling import secure_poisson_indices

# the most rows a sampled user contributes to a step unless the spec or the Trainer's
# arguments say (capped by the micro-batch; docs/privacy_unit.md, "Choosing
# max_examples_per_user")
DEFAULT_EXAMPLES_PER_USER = 8


@dataclass(frozen=True)
class UserIndex:
    """The examples of a data set grouped by user: ``order`` lists the example indices sorted
    by user key (stable), user j owning ``order[starts[j] : starts[j] + counts[j]]``."""

    order: torch.Tensor  # (N,) long
    starts: torch.Tensor  # (U,) long
    counts: torch.Tensor  # (U,) long
    keys: torch.Tensor  # (U,) long: each user's key, increasing

    @classmethod
    def of(cls, user_keys: torch.Tensor) -> UserIndex:
        """Group examples by their user's key (an integer per example)."""
        keys = torch.as_tensor(user_keys, dtype=torch.long).reshape(-1)
        if keys.numel() == 0:
            raise ValueError("a user-level data set needs at least one example")
        order = torch.argsort(keys, stable=True)
        unique, counts = torch.unique_consecutive(keys[order], return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        return cls(order, starts, counts, unique)

    @property
    def num_users(self) -> int:
        return int(self.keys.numel())

    @property
    def largest(self) -> int:
        """The most examples any user has."""
        return int(self.counts.max())


def user_micro_batches(
    rows: torch.Tensor, users: torch.Tensor, max_rows: int
) -> Iterator[torch.Tensor]:
    """Split one step's ``rows`` (grouped by user; ``users`` their user keys) into micro-batches
    of at most ``max_rows`` rows, never splitting a user (a user with more rows than
    ``max_rows`` is refused: its contribution must be clipped in one micro-batch)."""
    if rows.numel() == 0:
        return
    change = torch.ones(rows.numel(), dtype=torch.bool)
    change[1:] = users[1:] != users[:-1]
    starts = torch.nonzero(change).flatten().tolist() + [rows.numel()]
    begin = 0
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        if b - a > max_rows:
            raise ValueError(
                f"a user contributes {b - a} rows to a step, more than the micro-batch of "
                f"{max_rows}: raise max_physical_batch_size or lower max_examples_per_user"
            )
        if b - begin > max_rows:
            yield rows[begin:a]
            begin = a
    yield rows[begin:]


def split_between_users(rows: torch.Tensor, users: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``rows`` (grouped by user; ``users`` their user keys) in exactly ``parts`` consecutive
    pieces (some possibly empty), cut only between users, each cut at the user boundary
    nearest to an equal share of rows (the Trainer's fixed number of micro-batches)."""
    n = rows.numel()
    if n == 0:
        return [rows[:0] for _ in range(parts)]
    change = torch.ones(n, dtype=torch.bool)
    change[1:] = users[1:] != users[:-1]
    bounds = torch.nonzero(change).flatten().tolist() + [n]
    cuts = [0]
    for j in range(1, parts):
        target = j * n / parts
        cuts.append(min((b for b in bounds if b >= cuts[-1]), key=lambda b: abs(b - target)))
    cuts.append(n)
    return [rows[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


class UserPoissonSampler:
    """Yields ``steps`` tensors of example indices: the rows of the users sampled at rate
    ``sample_rate``, at most ``max_examples_per_user`` a user, grouped by user (see the module
    docstring). The engine's ``expected_batch_size`` is ``sample_rate · num_users``."""

    def __init__(
        self,
        users: UserIndex,
        sample_rate: float,
        steps: int,
        max_examples_per_user: int,
        seed: int | None = None,
        ranks: Ranks | None = None,
    ):
        if not (0 < sample_rate <= 1):
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        if not (isinstance(max_examples_per_user, int) and max_examples_per_user >= 1):
            raise ValueError(
                f"max_examples_per_user must be a positive integer, got {max_examples_per_user!r}"
            )
        self.users = users
        self.sample_rate = float(sample_rate)
        self.steps = steps
        self.max_examples_per_user = max_examples_per_user
        self.ranks = ranks or Ranks()
        self.generator = torch.Generator().manual_seed(_shared_seed(seed, self.ranks))

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.users.num_users

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.steps):
            yield self._next_batch()

    def _choose(self) -> torch.Tensor:
        """The positions (increasing) of the users sampled at the next step."""
        return poisson_indices(self.users.num_users, self.sample_rate, self.generator)

    def _next_batch(self) -> torch.Tensor:
        chosen = self._choose()
        rows, owner = self._rows_of(chosen)
        if not self.ranks.distributed:
            return rows
        return rows[owned(owner, self.ranks)]  # the rows of this rank's users (shard_indices)

    def _rows_of(self, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the ``chosen`` users (positions, increasing) contribute, and each row's
        user position: up to m rows a user, uniformly without replacement. The choice's coins
        are drawn for every chosen user on every rank (one shared stream)."""
        # numpy, single-threaded: a step's few thousand rows cost microseconds, where torch's
        # thread pool waits milliseconds for a busy core
        pos = chosen.numpy()
        counts = self.users.counts.numpy()[pos]
        total = int(counts.sum())
        if total == 0:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty
        group = np.repeat(np.arange(pos.size), counts)
        first = np.cumsum(counts) - counts
        within = np.arange(total) - first[group]
        rows = self.users.order.numpy()[self.users.starts.numpy()[pos][group] + within]
        coins = torch.rand(total, generator=self.generator, dtype=torch.float64).numpy()
        # a random order within each user (groups stay in order): sort by (group, coin)
        perm = np.lexsort((coins, group))
        keep = within < self.max_examples_per_user  # group[perm] == group: within is rank
        picked = perm[keep]
        return torch.from_numpy(rows[picked]), torch.from_numpy(pos[group[picked]])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator's state (safetensors-able). PRIVATE: it reveals the batches."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != {"generator"}:
            raise ValueError(f"not a UserPoissonSampler state: keys {sorted(state)}")
        self.generator.set_state(state["generator"])


class SecureUserPoissonSampler(UserPoissonSampler):
    """:class:`UserPoissonSampler` whose users' inclusion coins come from the secure stream
    (key HMAC(root, "sampling"), stream t for step t: geometric skips at ⌊q·2⁶⁴⌋/2⁶⁴), so
    the users of step t depend on (key, t) only; the lines of each sampled user are chosen by
    the seeded generator (see the module docstring). :meth:`state_dict` holds the sampling
    key: SECRET."""

    def __init__(
        self,
        users: UserIndex,
        sample_rate: float,
        steps: int,
        max_examples_per_user: int,
        seed: int | None = None,
        ranks: Ranks | None = None,
        stream: SecureStream | None = None,
    ):
        super().__init__(users, sample_rate, steps, max_examples_per_user, seed, ranks)
        self._stream = (SecureStream() if stream is None else stream).derive("sampling")
        self.step = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        while self.step < self.steps:
            yield self._next_batch()

    def _choose(self) -> torch.Tensor:
        chosen = secure_poisson_indices(
            self._stream.at(self.step), self.users.num_users, self.sample_rate
        )
        self.step += 1
        return chosen

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator's state, the step and the sampling key. SECRET."""
        return {
            **super().state_dict(),
            "meta.version": torch.tensor(STATE_VERSION, dtype=torch.int64),
            "meta.step": torch.tensor(self.step, dtype=torch.int64),
            "meta.num_users": torch.tensor(self.users.num_users, dtype=torch.int64),
            "key": self._stream.state_dict()["key"],
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = {"generator", "meta.version", "meta.step", "meta.num_users", "key"}
        if set(state) != expected:
            raise ValueError(f"not a SecureUserPoissonSampler state: keys {sorted(state)}")
        if int(state["meta.version"]) != STATE_VERSION:
            raise ValueError(
                f"unsupported SecureUserPoissonSampler state {int(state['meta.version'])}"
            )
        if int(state["meta.num_users"]) != self.users.num_users:
            raise ValueError(
                f"the state is of {int(state['meta.num_users'])} users, this sampler has "
                f"{self.users.num_users}"
            )
        step = int(state["meta.step"])
        if not 0 <= step <= self.steps:
            raise ValueError(f"the state's step {step} is outside 0..{self.steps}")
        super().load_state_dict({"generator": state["generator"]})
        key = bytes(torch.as_tensor(state["key"], dtype=torch.uint8).tolist())
        self._stream = SecureStream(key)
        self.step = step


__all__ = [
    "DEFAULT_EXAMPLES_PER_USER",
    "SecureUserPoissonSampler",
    "UserIndex",
    "UserPoissonSampler",
    "split_between_users",
    "user_micro_batches",
]
