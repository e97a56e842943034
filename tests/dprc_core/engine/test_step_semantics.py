"""Engine semantics that do not need a big model: noise, empty batches, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Clipping, Exact, Gaussian, Hutch, Sketched, UnsupportedModuleError


class TinyNet(nn.Module):
    def __init__(self, d_in=6, d_hidden=5, d_out=3, extra: nn.Module | None = None):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.norm = nn.LayerNorm(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)
        self.extra = extra

    def forward(self, x):
        h = torch.tanh(self.norm(self.fc1(x)))
        if self.extra is not None:
            h = self.extra(h)
        return self.fc2(h)


def mse_per_sample(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).sum(-1)


def data(b=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 6, generator=g, dtype=dtype), torch.randn(b, 3, generator=g, dtype=dtype)


def make_engine(model, clipping=None, noise=None, **kw):
    """Hutchinson clipping (k = 32) at C = 1 and σ = 1 unless ``clipping`` / ``noise`` say
    otherwise."""
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    args = dict(
        clipping=Clipping(1.0, Hutch()) if clipping is None else clipping,
        noise=Gaussian(1.0) if noise is None else noise,
        expected_batch_size=8,
        seed=0,
    )
    args.update(kw)
    return dprc_core.PrivacyEngine(model, opt, **args), opt


# ------------------------------------------------------------------------------- noise
def test_empty_logical_batch_is_a_noise_only_step():
    """grad = N(0, σ²C²)/B_expected per coordinate; check the sample std with a chi-square bound."""
    torch.manual_seed(0)
    model = nn.Linear(400, 300, dtype=torch.float64)  # 120 300 coordinates
    before = [p.detach().clone() for p in model.parameters()]
    sigma, clip, b = 1.7, 0.5, 4.0
    engine, _ = make_engine(
        model, clipping=Clipping(clip, Hutch()), noise=Gaussian(sigma), expected_batch_size=b
    )
    empty = (torch.zeros(0, 400, dtype=torch.float64), torch.zeros(0, 300, dtype=torch.float64))
    stats = engine.step(lambda m, batch: (m(batch[0]) - batch[1]).pow(2).sum(-1), empty)
    assert stats.batch_size == 0 and stats.clipped_fraction == 0.0 and math.isnan(stats.mean_loss)
    deltas = torch.cat([(p0 - p.detach()).flatten() for p0, p in zip(before, model.parameters())])
    n = deltas.numel()
    want_sd = sigma * clip / b
    # sample variance / σ² ~ χ²_n / n: |ratio − 1| ≤ 6·sqrt(2/n) (false failure < 1e-8)
    ratio = float(deltas.pow(2).mean()) / want_sd**2
    assert abs(ratio - 1) <= 6 * math.sqrt(2 / n)
    assert abs(float(deltas.mean())) <= 6 * want_sd / math.sqrt(n)


def test_noise_is_added_once_per_logical_batch():
    """Same seed: three micro-batches give exactly the update of one batch (noise drawn once);
    the noise of two separate steps would double the variance instead."""
    x, y = data(9)
    m1, m2 = TinyNet().double(), TinyNet().double()
    m2.load_state_dict(m1.state_dict())
    e1, _ = make_engine(m1, clipping=Clipping(1.0, Exact()), noise=Gaussian(2.0), seed=7)
    e2, _ = make_engine(m2, clipping=Clipping(1.0, Exact()), noise=Gaussian(2.0), seed=7)
    e1.step(mse_per_sample, (x, y))
    for s in (slice(0, 4), slice(4, 4), slice(4, 9)):
        e2.accumulate(mse_per_sample, (x[s], y[s]))
    e2.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2, rtol=1e-12, atol=1e-12)


def test_seed_none_draws_fresh_noise():
    x, y = data()
    updates = []
    for _ in range(2):
        torch.manual_seed(0)
        m = TinyNet().double()
        e, _ = make_engine(m, seed=None)
        e.step(mse_per_sample, (x, y))
        updates.append(m.fc1.weight.detach().clone())
    assert not torch.equal(updates[0], updates[1])


def test_two_pass_and_bookkeeping_agree_with_hutch_and_same_seed():
    x, y = data()
    m1, m2 = TinyNet().double(), TinyNet().double()
    m2.load_state_dict(m1.state_dict())
    e1, _ = make_engine(m1, clipping=Clipping(1.0, Hutch(3), clipped_sum="two_pass"), seed=3)
    e2, _ = make_engine(m2, clipping=Clipping(1.0, Hutch(3), clipped_sum="bookkeeping"), seed=3)
    s1, s2 = e1.step(mse_per_sample, (x, y)), e2.step(mse_per_sample, (x, y))
    torch.testing.assert_close(s1.per_sample_norms, s2.per_sample_norms)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2, rtol=1e-10, atol=1e-12)


def test_hooks_are_inert_outside_the_engine():
    x, y = data()
    m = TinyNet().double()
    ref = m(x).detach()
    e, _ = make_engine(m)
    torch.testing.assert_close(m(x), ref)  # a plain forward is unchanged, no graph surgery
    e.detach()
    assert not m.fc1._forward_hooks


# ------------------------------------------------------------------------------- errors
def test_unsupported_trainable_module_is_named():
    m = TinyNet(extra=nn.PReLU()).double()
    with pytest.raises(UnsupportedModuleError, match=r"'extra'.*PReLU"):
        make_engine(m)
    with pytest.raises(UnsupportedModuleError, match=r"'extra'.*PReLU"):
        dprc_core.per_sample_grad_norms(m, mse_per_sample, data())


def test_frozen_unsupported_module_is_fine():
    prelu = nn.PReLU().double().requires_grad_(False)
    m = TinyNet(extra=prelu).double()
    norms = dprc_core.per_sample_grad_norms(m, mse_per_sample, data())
    assert norms.shape == (8,)


def test_embedding_with_max_norm_is_refused():
    m = nn.Sequential(nn.Embedding(10, 4, max_norm=1.0))
    with pytest.raises(UnsupportedModuleError, match="max_norm"):
        dprc_core.per_sample_grad_norms(m, lambda m, b: m(b).sum((1, 2)), torch.ones(2, 3).long())


def test_reduced_loss_is_rejected():
    m = TinyNet().double()
    with pytest.raises(ValueError, match=r"per-sample losses of shape \[B\]"):
        dprc_core.per_sample_grad_norms(m, lambda m, b: mse_per_sample(m, b).mean(), data())
    with pytest.raises(ValueError, match="4 losses for a batch of 8"):
        dprc_core.per_sample_grad_norms(m, lambda m, b: mse_per_sample(m, b)[:4], data())
    e, _ = make_engine(m)
    with pytest.raises(ValueError, match="per-sample"):
        e.step(lambda m, b: mse_per_sample(m, b).sum(), data())


@pytest.mark.parametrize(
    "kwargs, match",
    [  # built inside pytest.raises: the objects refuse bad values where they are written
        (lambda: dict(noise=Gaussian(-0.1)), "noise_multiplier"),
        (lambda: dict(noise=Gaussian(float("nan"))), "noise_multiplier"),
        (lambda: dict(clipping=Clipping(0.0, Hutch())), "max_grad_norm"),
        (lambda: dict(expected_batch_size=0), "expected_batch_size"),
        (lambda: dict(clipping=Clipping(1.0, Hutch(0))), "k"),
        (lambda: dict(clipping=Clipping(1.0, Hutch(2.5))), "k"),
        (lambda: dict(clipping=Clipping(1.0, Sketched("magic"))), "norm method"),
        (lambda: dict(clipping=Clipping(1.0, Hutch(), clipped_sum="lazy")), "clipped_sum"),
    ],
)
def test_bad_engine_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_engine(TinyNet().double(), **kwargs())


def test_bad_norm_arguments():
    m = TinyNet().double()
    with pytest.raises(ValueError, match="k"):
        dprc_core.per_sample_grad_norms(m, mse_per_sample, data(), method="hutch", k=0)
    with pytest.raises(ValueError, match="norm method"):
        dprc_core.per_sample_grad_norms(m, mse_per_sample, data(), method="nope")


def test_optimizer_with_foreign_parameter_is_rejected():
    m = TinyNet().double()
    stray = nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([*m.parameters(), stray], lr=0.1)
    with pytest.raises(ValueError, match="not be privatized"):
        dprc_core.PrivacyEngine(
            m, opt, clipping=Clipping(1.0, Hutch()), noise=Gaussian(1.0), expected_batch_size=4
        )


def test_step_requires_both_or_neither():
    e, _ = make_engine(TinyNet().double())
    with pytest.raises(ValueError, match="both"):
        e.step(mse_per_sample)


# --------------------------------------------------------------- layers beyond HF models
def _per_sample_reference(model, loss_fn, xs):
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(xs.shape[0]):
        g = torch.autograd.grad(loss_fn(model, xs[i : i + 1])[0], params)
        out.append(torch.sqrt(sum(t.pow(2).sum() for t in g)))
    return torch.stack(out)


@pytest.mark.parametrize("method", ["fgc", "ghost"])
def test_rmsnorm_3d_and_4d_linear_inputs(method):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.RMSNorm(7), nn.Linear(7, 2)).double()
    loss = lambda m, x: m(x).pow(2).sum(dim=tuple(range(1, x.dim())))  # noqa: E731
    for shape in [(4, 5), (4, 3, 5), (4, 2, 3, 5)]:
        x = torch.randn(*shape, dtype=torch.float64)
        ref = _per_sample_reference(model, loss, x)
        got = dprc_core.per_sample_grad_norms(model, loss, x, method=method)
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=0)


class FunctionalTie(nn.Module):
    """Output layer computed functionally from the embedding weight: not hookable."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 4)

    def forward(self, ids):
        return torch.nn.functional.linear(self.emb(ids), self.emb.weight)


def test_functional_use_of_a_parameter_is_refused():
    m = FunctionalTie().double()
    ids = torch.randint(0, 11, (3, 5))
    loss = lambda m, x: m(x).logsumexp(-1).sum(-1)  # noqa: E731
    with pytest.raises(UnsupportedModuleError, match=r"'emb.weight' is used 2 time"):
        dprc_core.per_sample_grad_norms(m, loss, ids)
    e, _ = make_engine(m, clipping=Clipping(1.0, Hutch(), clipped_sum="two_pass"))
    with pytest.raises(UnsupportedModuleError, match="functional use"):
        e.step(loss, ids)


def test_hutch_projections_are_fresh_every_step():
    """lr = 0, σ = 0: the same batch twice gives different Hutchinson estimates (new P)."""
    x, y = data()
    m = TinyNet().double()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    e = dprc_core.PrivacyEngine(
        m,
        opt,
        clipping=Clipping(1.0, Hutch(2)),
        noise=Gaussian(0.0),
        expected_batch_size=8,
        seed=5,
    )
    a = e.step(mse_per_sample, (x, y)).per_sample_norms
    b = e.step(mse_per_sample, (x, y)).per_sample_norms
    assert not torch.allclose(a, b)
