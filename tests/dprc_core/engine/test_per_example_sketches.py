"""Per-example sketches (issue 18, engine): independent projections per example, keyed by
(secret, step, parameter, example id).

* σ = 0: E[n̂_i²] = ‖g_i‖² per example (z-test over fresh steps), g_i from torch.func, for
  hutch and hutch++ on a model with an embedding tied to its output head and a linear layer.
* Two copies of one example in a batch get different estimates (their own projections), where
  a shared sketch gives them the same one.
* The same examples split into micro-batches, in another order, give bit for bit the same
  per-example norms and (float64) the same update to 1e-12.
* Secure mode draws them from the ChaCha20 stream; its state resumes them.
* Bad input: per_example with an exact method, repeated or mis-sized example ids.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Auto, Clipping, Gaussian, Hutch, HutchPP
from dprc_core.clipping import norm_from_method
from dprc_core.hooks import PerSampleHooks
from dprc_core.noise import SecureStream
from dprc_core.sketches import per_example_source
from tests.conftest import torch_func_per_sample_grads

V, D, T = 11, 6, 5


class TiedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight  # tied: one parameter, one projection per example

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.emb(ids))))


def loss_fn(model, batch):
    logits = model(ids=batch["ids"])
    return (
        nn.functional.cross_entropy(logits.reshape(-1, V), batch["y"].reshape(-1), reduction="none")
        .reshape(batch["ids"].shape)
        .sum(-1)
    )


def make_batch(b: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "ids": torch.randint(V, (b, T), generator=g),
        "y": torch.randint(V, (b, T), generator=g),
    }


def make_model(seed: int = 0) -> TiedNet:
    torch.manual_seed(seed)
    return TiedNet().double()


def _sq_norms(hooks, batch, method: str, source) -> torch.Tensor:
    _, result = hooks.norm_pass(
        loss_fn,
        batch,
        method=method,
        k=4,
        generator_for=source,
        retain_graph=False,
        keep_contributions=False,
    )
    return result.sq_norms


@pytest.mark.parametrize("method", ["hutch", "hutchpp"])
def test_unbiased_per_example(method):
    model = make_model()
    batch = make_batch(6)
    exact = torch_func_per_sample_grads(model, loss_fn, batch)
    truth = sum(g.flatten(1).pow(2).sum(1) for g in exact.values())
    hooks = PerSampleHooks(model)
    try:
        ids = list(range(100, 106))
        draws = torch.stack(
            [
                _sq_norms(hooks, batch, method, per_example_source(7, step, ids, None))
                for step in range(400)
            ]
        )
    finally:
        hooks.remove()
    mean, se = draws.mean(0), draws.std(0) / draws.shape[0] ** 0.5
    z = (mean - truth) / se
    assert z.abs().max() < 5.0, (mean, truth, z)
    # and the draws do vary (a fixed projection would give se = 0 and a biased mean)
    assert (draws.std(0) > 0).all()


def test_each_example_has_its_own_projection():
    model = make_model()
    one = make_batch(1)
    twice = {k: v.repeat(2, 1) for k, v in one.items()}
    hooks = PerSampleHooks(model)
    try:
        per = _sq_norms(hooks, twice, "hutch", per_example_source(3, 0, [0, 1], None))
        gen = torch.Generator().manual_seed(3)
        shared = _sq_norms(hooks, twice, "hutch", lambda device, name: gen)
    finally:
        hooks.remove()
    assert shared[0] == shared[1]
    assert per[0] != per[1]


PER_EXAMPLE_HUTCH = Hutch(4, sketch="per_example")


def _engine(model, clipping=None, noise=None, **kw):
    """C = 0.5, Hutchinson with k = 4 per-example projections and σ = 0 unless ``clipping`` /
    ``noise`` say otherwise."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    args = dict(
        clipping=Clipping(0.5, PER_EXAMPLE_HUTCH) if clipping is None else clipping,
        noise=Gaussian(0.0) if noise is None else noise,
        expected_batch_size=8,
        seed=11,
    )
    args.update(kw)
    with warnings.catch_warnings():  # σ = 0 warns that nothing is private: intended here
        warnings.simplefilter("ignore", dprc_core.PrivacyWarning)
        return dprc_core.PrivacyEngine(model, opt, **args)


def _select(batch, idx):
    return {k: v[idx] for k, v in batch.items()}


@pytest.mark.parametrize("norm", [Hutch, HutchPP], ids=["hutch", "hutchpp"])
def test_micro_batches_in_any_order_give_the_same_step(norm):
    batch = make_batch(8, seed=1)
    ids = torch.arange(40, 48)
    clipping = Clipping(0.5, norm(4, sketch="per_example"))
    whole_model = make_model()
    whole = _engine(whole_model, clipping=clipping)
    stats_whole = whole.step(loss_fn, batch, example_ids=ids)

    split_model = make_model()
    split = _engine(split_model, clipping=clipping)
    order = [torch.tensor([5, 2, 7]), torch.tensor([0, 6]), torch.tensor([3, 1, 4])]
    for part in order:
        split.accumulate(loss_fn, _select(batch, part), example_ids=ids[part])
    stats_split = split.step()

    norms_split = torch.empty(8, dtype=torch.float64)
    norms_split[torch.cat(order)] = stats_split.per_sample_norms
    assert torch.equal(norms_split, stats_whole.per_sample_norms)  # bit for bit
    for p, q in zip(whole_model.parameters(), split_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    whole.detach()
    split.detach()


def test_steps_and_seeds_change_the_projections():
    batch = make_batch(4, seed=2)
    ids = torch.arange(4)
    norms = []
    for seed in (11, 11, 12):
        engine = _engine(make_model(), seed=seed)
        norms.append([engine.step(loss_fn, batch, example_ids=ids).per_sample_norms for _ in "ab"])
        engine.detach()
    (a0, a1), (b0, b1), (c0, _) = norms
    assert torch.equal(a0, b0) and torch.equal(a1, b1)  # (seed, step, id): deterministic
    assert not torch.equal(a0, c0)  # another secret
    assert not torch.allclose(a1, a0)  # another step (the model moved too, but sketches differ)


def test_secure_mode_projections_come_from_the_stream_and_resume():
    batch = make_batch(4, seed=3)
    ids = torch.arange(4)
    root = SecureStream()
    first = _engine(make_model(), noise=Gaussian(1.0, secure=True), secure_stream=root)
    assert first.accounting_sketch == "per_example"
    state = first.state_dict()
    a = first.step(loss_fn, batch, example_ids=ids).per_sample_norms
    seeded = _engine(make_model(), noise=Gaussian(1.0))
    assert not torch.equal(a, seeded.step(loss_fn, batch, example_ids=ids).per_sample_norms)
    other = _engine(make_model(), noise=Gaussian(1.0, secure=True))  # a fresh OS key
    assert not torch.equal(a, other.step(loss_fn, batch, example_ids=ids).per_sample_norms)
    other.load_state_dict(state)  # the first engine's key and step 0 ...
    resumed = _engine(make_model(), noise=Gaussian(1.0, secure=True))
    resumed.load_state_dict(state)
    assert torch.equal(a, resumed.step(loss_fn, batch, example_ids=ids).per_sample_norms)
    with pytest.raises(ValueError, match="state"):  # a secure state in a seeded engine
        seeded.load_state_dict(state)
    for e in (first, seeded, other, resumed):
        e.detach()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="randomized norm method"):  # as a job spec names it
        _engine(
            make_model(),
            clipping=Clipping(0.5, norm_from_method("exact", k=4, sketch="per_example")),
        )
    with pytest.raises(ValueError, match="sketch must be one of"):
        _engine(make_model(), clipping=Clipping(0.5, Hutch(4, sketch="per-example")))
    engine = _engine(make_model())
    batch = make_batch(3)
    with pytest.raises(ValueError, match="3 samples"):
        engine.accumulate(loss_fn, batch, example_ids=[1, 2])
    with pytest.raises(ValueError, match="repeat"):
        engine.accumulate(loss_fn, batch, example_ids=[1, 2, 2])
    engine.accumulate(loss_fn, batch, example_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="repeat"):
        engine.accumulate(loss_fn, batch, example_ids=[3, 4, 5])
    with pytest.raises(ValueError, match="data set indices"):
        engine.accumulate(loss_fn, batch, example_ids=[-1, 4, 5])
    engine.detach()


def test_without_ids_positions_key_the_projections():
    batch = make_batch(4, seed=4)
    a = _engine(make_model())
    b = _engine(make_model())
    na = a.step(loss_fn, batch).per_sample_norms
    b.accumulate(loss_fn, _select(batch, torch.arange(2)))
    b.accumulate(loss_fn, _select(batch, torch.arange(2, 4)))
    assert torch.equal(na, b.step().per_sample_norms)  # positions 0..3 either way
    assert a.accounting_sketch == "per_example"
    shared = _engine(make_model(), clipping=Clipping(0.5, Hutch(4, sketch="shared")))
    assert shared.accounting_sketch == "shared"
    exact_auto = _engine(make_model(), clipping=Clipping(0.5, Auto(T, k=512, sketch="per_example")))
    assert exact_auto.accounting_envelope == "exact"
    assert exact_auto.accounting_sketch == "shared"  # nothing sketched: nothing per example
    for e in (a, b, shared, exact_auto):
        e.detach()


def weighted_loss(model, batch):
    return loss_fn(model, batch) * batch["w"]


@pytest.mark.parametrize("mode", ["bookkeeping", "two_pass"])
def test_a_dropped_sample_leaves_the_others_projections_alone(mode):
    """A non-finite sample is dropped (two_pass reruns the kept ones): the kept examples keep
    their keys, so their norms are those of a batch without the bad sample."""
    batch = {**make_batch(4, seed=5), "w": torch.tensor([1.0, 1.0, float("nan"), 1.0]).double()}
    ids = torch.tensor([7, 3, 9, 1])
    keep = torch.tensor([0, 1, 3])
    clipping = Clipping(0.5, PER_EXAMPLE_HUTCH, clipped_sum=mode)
    clean = _engine(make_model(), clipping=clipping)
    want = clean.step(weighted_loss, _select(batch, keep), example_ids=ids[keep])
    engine = _engine(make_model(), clipping=clipping)
    stats = engine.step(weighted_loss, batch, example_ids=ids)
    assert stats.dropped == 1
    norms = stats.per_sample_norms
    got = norms[keep] if mode == "bookkeeping" else norms[torch.isfinite(norms)]
    assert torch.equal(got, want.per_sample_norms)
    for e in (clean, engine):
        e.detach()
