"""Poisson sampling of users (issue 31): each user is included with probability q (binomial
z-test), contributes at most m of its own rows, distinct, chosen uniformly (chi-square over a
user's rows), grouped by user; ranks split users, never a user's rows, and their union is the
single process's step; micro-batches never split a user; the state resumes the draws."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from dprc_core.distributed import Ranks
from dprc_core.noise.secure_stream import SecureStream
from dprc_core.training.secure_sampling import SecurePoissonSampler
from dprc_core.training.user_sampling import (
    SecureUserPoissonSampler,
    UserIndex,
    UserPoissonSampler,
    split_between_users,
    user_micro_batches,
)

# user keys of 64 examples: user 10 has 40, user 20 has 3, users 30..50 one each
KEYS = torch.tensor([10] * 40 + [20] * 3 + list(range(30, 51)))
perm = torch.randperm(KEYS.numel(), generator=torch.Generator().manual_seed(0))
KEYS = KEYS[perm]  # examples of one user scattered through the file


def _draws(q=0.3, steps=2000, m=4, seed=1, ranks=None):
    users = UserIndex.of(KEYS)
    return list(UserPoissonSampler(users, q, steps, m, seed=seed, ranks=ranks)), users


def test_each_step_holds_whole_users_of_at_most_m_distinct_own_rows():
    draws, users = _draws()
    assert users.num_users == 2 + 21 and users.largest == 40
    for rows in draws[:300]:
        owners = KEYS[rows]
        # grouped: each user's rows are contiguous
        changes = int((owners[1:] != owners[:-1]).sum()) + (1 if rows.numel() else 0)
        assert changes == torch.unique(owners).numel()
        assert rows.unique().numel() == rows.numel()
        for user in torch.unique(owners).tolist():
            have = int((KEYS == user).sum())
            assert int((owners == user).sum()) == min(have, 4)


def test_users_are_included_at_rate_q_and_rows_chosen_uniformly():
    q, steps = 0.3, 2000
    draws, users = _draws(q, steps)
    included = torch.zeros(users.num_users)
    big_rows = torch.nonzero(KEYS == 10).flatten()
    row_counts = torch.zeros(KEYS.numel())
    for rows in draws:
        included[torch.searchsorted(users.keys, torch.unique(KEYS[rows]))] += 1
        row_counts[rows] += 1
    z = (included - steps * q) / math.sqrt(steps * q * (1 - q))
    assert z.abs().max() < 4.5, z
    # the 40-row user: each of its rows taken 4/40 of the times it was included, uniformly
    times = included[torch.searchsorted(users.keys, torch.tensor([10]))].item()
    observed = row_counts[big_rows]
    assert observed.sum() == 4 * times
    _, p = stats.chisquare(observed.numpy())
    assert p > 1e-4, p


def test_ranks_split_users_and_their_union_is_the_single_process_step():
    single, _ = _draws(steps=50, seed=7)
    parts = []
    for r in (0, 1):  # rank r of 2 with the seed every rank agreed on
        sampler = UserPoissonSampler(UserIndex.of(KEYS), 0.3, 50, 4, seed=7)
        sampler.ranks = Ranks(rank=r, world_size=2)
        parts.append(list(sampler))
    for whole, a, b in zip(single, *parts, strict=True):
        assert not set(KEYS[a].tolist()) & set(KEYS[b].tolist())  # no user on both ranks
        assert sorted(torch.cat([a, b]).tolist()) == sorted(whole.tolist())


def test_micro_batches_never_split_a_user():
    draws, _ = _draws(steps=100, m=4)
    for rows in draws:
        pieces = list(user_micro_batches(rows, KEYS[rows], 5))
        assert torch.equal(torch.cat(pieces) if pieces else rows, rows)
        seen: set[int] = set()
        for piece in pieces:
            assert piece.numel() <= 5
            owners = set(KEYS[piece].tolist())
            assert not owners & seen
            seen |= owners
    with pytest.raises(ValueError, match="max_examples_per_user"):
        list(user_micro_batches(torch.arange(6), torch.tensor([1] * 6), 5))


def test_the_state_resumes_the_draws():
    users = UserIndex.of(KEYS)
    a = UserPoissonSampler(users, 0.3, 6, 4, seed=3)
    it = iter(a)
    first = [next(it) for _ in range(3)]
    state = {k: v.clone() for k, v in a.state_dict().items()}
    rest = list(it)
    b = UserPoissonSampler(users, 0.3, 3, 4, seed=99)
    b.load_state_dict(state)
    again = list(b)
    assert len(first) == 3
    for x, y in zip(rest, again, strict=True):
        assert torch.equal(x, y)


def test_bad_input_is_refused():
    users = UserIndex.of(KEYS)
    with pytest.raises(ValueError, match="max_examples_per_user"):
        UserPoissonSampler(users, 0.3, 5, 0)
    with pytest.raises(ValueError, match="sample_rate"):
        UserPoissonSampler(users, 0.0, 5, 2)
    with pytest.raises(ValueError, match="at least one example"):
        UserIndex.of(torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_a_step_splits_into_exactly_the_trainers_micro_batches_between_users(parts):
    draws, _ = _draws(steps=60, m=4)
    for rows in draws:
        pieces = split_between_users(rows, KEYS[rows], parts)
        assert len(pieces) == parts
        assert torch.equal(torch.cat(pieces), rows)
        owners = [set(KEYS[p].tolist()) for p in pieces]
        for i, a in enumerate(owners):
            for b in owners[i + 1 :]:
                assert not a & b


# -- secure mode: the users' coins from the ChaCha20 stream ------------------------------------


def _secure(q=0.3, steps=2000, m=4, key=b"k" * 32, seed=1):
    users = UserIndex.of(KEYS)
    sampler = SecureUserPoissonSampler(users, q, steps, m, seed=seed, stream=SecureStream(key))
    return sampler, users


def test_secure_mode_samples_users_at_rate_q_from_the_stream():
    q, steps = 0.3, 2000
    sampler, users = _secure(q, steps)
    included = torch.zeros(users.num_users)
    for rows in sampler:
        owners = KEYS[rows]
        for user in torch.unique(owners).tolist():
            assert int((owners == user).sum()) == min(int((KEYS == user).sum()), 4)
        included[torch.searchsorted(users.keys, torch.unique(owners))] += 1
    z = (included - steps * q) / math.sqrt(steps * q * (1 - q))
    assert z.abs().max() < 4.5, z
    # the users of step t are the secure example sampler's draw over U items at step t
    reference = SecurePoissonSampler(users.num_users, q, 5, stream=SecureStream(b"k" * 32))
    again, _ = _secure(q, 5)
    for t, rows in enumerate(again):
        positions = torch.searchsorted(users.keys, torch.unique(KEYS[rows]))
        assert torch.equal(positions, reference.batch(t))


def test_secure_mode_state_resumes_the_draws_and_is_checked():
    sampler, users = _secure(steps=6, key=bytes(range(32)))
    it = iter(sampler)
    [next(it) for _ in range(3)]
    state = {k: v.clone() for k, v in sampler.state_dict().items()}
    rest = list(it)
    other = SecureUserPoissonSampler(users, 0.3, 6, 4, seed=99)  # its own fresh key
    other.load_state_dict(state)
    for x, y in zip(rest, list(other), strict=True):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="users"):
        SecureUserPoissonSampler(UserIndex.of(torch.arange(5)), 0.3, 6, 4).load_state_dict(state)
    with pytest.raises(ValueError, match="not a SecureUserPoissonSampler state"):
        other.load_state_dict({"generator": state["generator"]})
