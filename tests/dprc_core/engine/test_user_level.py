"""User-level DP in the engine (issue 31): ``accumulate(..., user_ids=)`` clips each user's
gradient — the sum over the user's rows — to C as one sample.

* σ = 0, float64: the update equals Σ_u min(1, C/‖G_u‖)·G_u / B_expected with G_u the sum of
  the user's per-row gradients from torch.func, to 1e-10 — users with 1, 2, 3 and 40 rows,
  interleaved in the batch, other users of the data set absent, micro-batches of several sizes
  (each user whole in one), exact norms (ghost / materialised, book-keeping and two-pass clipped
  sums) and ``auto``.
* Per-user Hutchinson with per-example sketches keyed by the user: E[n̂_u²] = ‖G_u‖² (z-test
  over fresh steps).
* A user with 500 rows moves the update by at most C (measured), as a user with one row.
* Bad input: a user split across micro-batches, user and example ids together, a logical
  batch mixing micro-batches with and without user ids, mis-sized ids.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Auto, Clipping, Exact, Gaussian, Hutch
from dprc_core.hooks import PerSampleHooks
from dprc_core.privacy_units import group_rows
from dprc_core.sketches import per_example_source
from tests.conftest import torch_func_per_sample_grads

V, D, T = 13, 6, 4


class Net(nn.Module):
    """Embedding tied to the output head, a LayerNorm (vector parameters) and a Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.norm = nn.LayerNorm(D)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.norm(self.emb(ids)))))


def loss_fn(model, batch):
    logits = model(ids=batch["ids"])
    return (
        nn.functional.cross_entropy(logits.reshape(-1, V), batch["y"].reshape(-1), reduction="none")
        .reshape(batch["ids"].shape)
        .sum(-1)
    )


def make_model(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().double()


# users 7 (1 row), 3 (3 rows), 12 (40 rows), 5 (2 rows), interleaved; users 1, 2, 4 of the
# data set are not sampled in this step
USERS = [12, 3, 7, 12, 12, 5, 3] + [12] * 30 + [5, 3] + [12] * 7
ROWS = len(USERS)


def make_batch(b: int = ROWS, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "ids": torch.randint(V, (b, T), generator=g),
        "y": torch.randint(V, (b, T), generator=g),
    }


def user_grads(model, batch, users) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Each user's summed gradient {name: (U, *shape)} from torch.func, users in order."""
    per_row = torch_func_per_sample_grads(model, loss_fn, batch)
    order = list(dict.fromkeys(users))
    index = torch.tensor([order.index(u) for u in users])
    summed = {
        n: torch.zeros(len(order), *g.shape[1:], dtype=g.dtype).index_add_(0, index, g)
        for n, g in per_row.items()
    }
    return order, summed


def _norms(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(g.flatten(1).pow(2).sum(1) for g in grads.values()).sqrt()


def _engine(model, clipping, expected=4.0, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():  # σ = 0 warns that nothing is private: intended here
        warnings.simplefilter("ignore", dprc_core.PrivacyWarning)
        return dprc_core.PrivacyEngine(
            model,
            opt,
            clipping=clipping,
            noise=Gaussian(0.0),
            expected_batch_size=expected,
            seed=3,
            **kw,
        )


def _select(batch, rows):
    return {k: v[rows] for k, v in batch.items()}


SPLITS = {
    "one micro-batch": [[12, 3, 7, 5]],
    "two": [[7, 12], [3, 5]],
    "one user each": [[5], [12], [7], [3]],
}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize(
    "clipping_of",
    [
        lambda c: Clipping(c, Exact()),
        lambda c: Clipping(c, Exact(), clipped_sum="two_pass"),
        lambda c: Clipping(c, Auto(max_seq_len=40 * T)),  # a user: up to 40 rows
    ],
    ids=["exact", "exact-two-pass", "auto"],
)
def test_the_update_is_the_mean_of_clipped_user_gradients(split, clipping_of):
    batch = make_batch()
    ref_model = make_model()
    order, grads = user_grads(ref_model, batch, USERS)
    norms = _norms(grads)
    c = float(norms.median())  # some users clipped, some not
    factors = (c / norms).clamp(max=1.0)
    expected_batch = 4.0
    want = {
        n: (g * factors.reshape(-1, *[1] * (g.dim() - 1))).sum(0) / expected_batch
        for n, g in grads.items()
    }

    model = make_model()
    engine = _engine(model, clipping_of(c), expected=expected_batch)
    users = torch.tensor(USERS)
    for part in SPLITS[split]:
        rows = torch.nonzero(torch.isin(users, torch.tensor(part))).flatten()
        engine.accumulate(loss_fn, _select(batch, rows), user_ids=users[rows])
    stats = engine.step()
    engine.detach()
    assert stats.batch_size == 4  # the units are the users
    named = dict(model.named_parameters())
    for name, g in want.items():
        torch.testing.assert_close(named[name].grad, g, rtol=0, atol=1e-10)
    got = torch.sort(stats.per_sample_norms).values
    torch.testing.assert_close(got, torch.sort(norms).values, rtol=1e-10, atol=1e-12)
    assert 0 < stats.clipped_fraction < 1


def test_per_user_hutchinson_is_unbiased():
    model = make_model()
    batch = make_batch()
    order, grads = user_grads(model, batch, USERS)
    truth = _norms(grads).pow(2)
    groups = group_rows(USERS)
    assert list(groups.keys) == order
    hooks = PerSampleHooks(model)
    try:
        draws = []
        for step in range(300):
            _, result = hooks.norm_pass(
                loss_fn,
                batch,
                method="hutch",
                k=4,
                generator_for=per_example_source(5, step, list(groups.keys), None),
                retain_graph=False,
                keep_contributions=False,
                groups=groups,
            )
            draws.append(result.sq_norms)
        draws_t = torch.stack(draws)
    finally:
        hooks.remove()
    mean, se = draws_t.mean(0), draws_t.std(0) / draws_t.shape[0] ** 0.5
    z = (mean - truth) / se
    assert z.abs().max() < 5.0, (mean, truth, z)
    assert (draws_t.std(0) > 0).all()


def test_a_per_user_sketch_step_runs_and_keys_projections_by_user():
    batch = make_batch()
    users = torch.tensor(USERS)
    clipping = Clipping(0.5, Hutch(4, sketch="per_example"))
    a = _engine(make_model(), clipping)
    whole = a.step(loss_fn, batch, user_ids=users).per_sample_norms
    b = _engine(make_model(), clipping)
    for part in SPLITS["two"]:
        rows = torch.nonzero(torch.isin(users, torch.tensor(part))).flatten()
        b.accumulate(loss_fn, _select(batch, rows), user_ids=users[rows])
    split = b.step().per_sample_norms
    a.detach()
    b.detach()
    # the same users' norms, whatever the micro-batches: their projections are the users'
    assert torch.allclose(torch.sort(whole).values, torch.sort(split).values, rtol=1e-12)


@pytest.mark.parametrize("rows", [1, 500])
def test_a_user_moves_the_update_by_at_most_c(rows):
    c = 0.25
    batch = make_batch(rows, seed=rows)
    model = make_model()
    engine = _engine(model, Clipping(c, Exact()), expected=1.0)
    engine.step(loss_fn, batch, user_ids=[9] * rows)
    engine.detach()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert norm <= c * (1 + 1e-12)
    if rows == 500:  # clipped to C exactly (its 500 rows' gradient is far larger)
        assert norm == pytest.approx(c, rel=1e-9)


def test_bad_input_is_refused():
    batch = make_batch(6)
    engine = _engine(make_model(), Clipping(0.5, Exact()))
    with pytest.raises(ValueError, match="6 rows"):
        engine.accumulate(loss_fn, batch, user_ids=[1, 2])
    with pytest.raises(ValueError, match="2\\*\\*62"):
        engine.accumulate(loss_fn, batch, user_ids=[1, 2, 3, 4, 5, -1])
    engine.accumulate(loss_fn, batch, user_ids=[1, 1, 2, 2, 3, 3])
    with pytest.raises(ValueError, match="one micro-batch"):
        engine.accumulate(loss_fn, batch, user_ids=[4, 4, 5, 5, 3, 6])  # user 3 again
    with pytest.raises(ValueError, match="mixes"):
        engine.accumulate(loss_fn, batch)
    with pytest.raises(ValueError, match="not both"):
        engine.accumulate(loss_fn, batch, example_ids=range(6), user_ids=range(6))
    engine.detach()
