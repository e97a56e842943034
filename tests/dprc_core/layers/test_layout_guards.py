"""The layout guards: outputs without a batch dimension, sequence-first layouts, outputs shared
by the batch, functional uses hidden by unused calls, checkpointing — each either computed
exactly (against torch.func per-sample gradients) or refused, never silently wrong, in float32
as in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import dprc_core
from dprc_core import Clipping, Exact, Gaussian, SampleMixingError, UnsupportedModuleError


def _seq_loss(model, x):
    return model(x).pow(2).sum((1, 2))


def _engine(model, clipped_sum="bookkeeping"):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    return dprc_core.PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, Exact(), clipped_sum=clipped_sum),
        noise=Gaussian(1.0),
        expected_batch_size=4.0,
    )


def _autograd_norms(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Reference per-sample gradient norms: one plain autograd pass per sample alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(_seq_loss(model, x[i : i + 1])[0], params)
        norms.append(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
    return torch.stack(norms)


class PairBias(nn.Module):
    """Like T5's relative position bias: an embedding of a (T, T) table, output (T, T, H) with
    no batch dimension, added to per-sample scores (B, H, T, T)."""

    def __init__(self, d=8, heads=2, buckets=5):
        super().__init__()
        self.proj = nn.Linear(d, heads)
        self.bias = nn.Embedding(buckets, heads)
        self.buckets = buckets

    def forward(self, x):
        t = x.shape[1]
        pos = torch.arange(t)
        table = (pos[None, :] - pos[:, None]).abs().clamp(max=self.buckets - 1)
        bias = self.bias(table).permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T)
        scores = self.proj(x).transpose(1, 2)[:, :, :, None] * 0.1 + bias  # (B, H, T, T)
        return scores.flatten(2).tanh()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_output_without_batch_dimension_is_refused_in_every_dtype(dtype):
    """T = 8, B = 4: T % B == 0 let (T, T, H) pass as "batch-major flattened"; in float32 the
    loose tolerance of the old check let the wrong norms through."""
    torch.manual_seed(0)
    model = PairBias().to(dtype)
    x = torch.randn(4, 8, 8, dtype=dtype)
    with pytest.raises(SampleMixingError, match="'bias'.*leading dimension is not the batch"):
        _engine(model).step(_seq_loss, x)
    with pytest.raises(SampleMixingError, match="'bias'"):
        dprc_core.per_sample_grad_norms(model, _seq_loss, x)  # the guard is the default
    model.bias.requires_grad_(False)  # the rest of the model is per-sample
    x64 = x.double()
    model = model.double()
    ref = _autograd_norms(model, x64)
    got = dprc_core.per_sample_grad_norms(model, _seq_loss, x64)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=0)


class SeqFirstFFN(nn.Module):
    """Runs its Linear layers on (T, B, d), as FSMT and XLNet do."""

    def __init__(self, d=6):
        super().__init__()
        self.up = nn.Linear(d, 12)
        self.down = nn.Linear(12, d)

    def forward(self, x):
        h = x.transpose(0, 1)  # (T, B, d)
        return self.down(torch.tanh(self.up(h))).transpose(0, 1)


@pytest.mark.parametrize("t", [4, 8])  # T == B, and T a multiple of B
def test_sequence_first_layers_are_refused_in_float32(t):
    torch.manual_seed(1)
    x = torch.randn(4, t, 6)
    with pytest.raises(SampleMixingError):
        _engine(SeqFirstFFN()).step(_seq_loss, x)
    with pytest.raises(SampleMixingError):
        dprc_core.per_sample_grad_norms(SeqFirstFFN(), _seq_loss, x)


class IndexesShared(nn.Module):
    """Takes row 0 of a batch-shared (1, T, d) output: the expansion that gives each sample its
    own copy would route every sample's gradient through sample 0."""

    def __init__(self, d=6, t=5):
        super().__init__()
        self.pos = nn.Embedding(t, d)
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        p = self.pos(torch.arange(x.shape[1])[None, :])  # (1, T, d)
        return self.lin(x + p[0])


def test_a_shared_output_the_model_indexes_is_refused():
    torch.manual_seed(2)
    model = IndexesShared().double()
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    with pytest.raises(SampleMixingError, match="pos.weight"):
        dprc_core.per_sample_grad_norms(model, _seq_loss, x)
    with pytest.raises(SampleMixingError, match="pos.weight"):
        _engine(model).step(_seq_loss, x)
    with pytest.raises(UnsupportedModuleError, match="shared by the batch"):
        dprc_core.per_sample_grad_norms(model, _seq_loss, x, check_independence=False)


class BroadcastsShared(IndexesShared):
    def forward(self, x):
        return self.lin(x + self.pos(torch.arange(x.shape[1])[None, :]))


def test_a_shared_output_that_broadcasts_is_exact():
    torch.manual_seed(3)
    model = BroadcastsShared().double()
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    ref = _autograd_norms(model, x)
    torch.testing.assert_close(
        dprc_core.per_sample_grad_norms(model, _seq_loss, x), ref, rtol=1e-10, atol=0
    )


class RepeatsShared(nn.Module):
    """Repeats a batch-shared (1, T, d) output over the batch itself (as DeBERTa does)."""

    def __init__(self, d=6, t=5):
        super().__init__()
        self.pos = nn.Embedding(t, d)
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        p = self.pos(torch.arange(x.shape[1])[None, :])
        return self.lin(x * p.repeat(x.shape[0], 1, 1).reshape(x.shape))


def test_a_shared_output_the_model_repeats_is_refused_naming_the_module():
    model = RepeatsShared().double()
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    with pytest.raises(UnsupportedModuleError, match=r"\['pos'\].*freeze"):
        dprc_core.per_sample_grad_norms(model, _seq_loss, x)


class UnusedCallHidesFunctionalUse(nn.Module):
    """Calls ``lin`` once on a branch that never reaches the loss and uses ``lin.weight``
    functionally on the branch that does: the old guard counted the unused call as a use."""

    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d, bias=False)
        self.head = nn.Linear(d, d)

    def forward(self, x):
        _ = self.lin(x)  # never reaches the loss
        return self.head(torch.nn.functional.linear(x, self.lin.weight))


@pytest.mark.parametrize("mode", ["bookkeeping", "two_pass"])
def test_an_unused_call_does_not_hide_a_functional_use(mode):
    model = UnusedCallHidesFunctionalUse().double()
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    with pytest.raises(UnsupportedModuleError, match="lin.weight.*functional"):
        dprc_core.per_sample_grad_norms(model, _seq_loss, x)
    with pytest.raises(UnsupportedModuleError, match="lin.weight.*functional"):
        _engine(model, clipped_sum=mode).step(_seq_loss, x)


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool, d=6):
        super().__init__()
        self.reentrant = reentrant
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x):
        h = checkpoint(lambda y: torch.tanh(self.a(y)), x, use_reentrant=self.reentrant)
        return self.b(h)


def test_non_reentrant_checkpointing_is_exact_and_reentrant_is_refused():
    torch.manual_seed(4)
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    model = Checkpointed(reentrant=False).double()
    want = _autograd_norms(model, x)
    got = dprc_core.per_sample_grad_norms(model, _seq_loss, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
    with pytest.raises(UnsupportedModuleError, match="'a' ran without autograd"):
        dprc_core.per_sample_grad_norms(Checkpointed(reentrant=True).double(), _seq_loss, x)


def test_the_check_leaves_every_tensor_in_its_own_dtype():
    """The check runs in float64 and casts back exactly: a bfloat16 model with a float32
    buffer keeps both, bit for bit."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3)).to(torch.bfloat16)
    model.register_buffer("scale", torch.full((3,), 0.5, dtype=torch.float32))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    loss = lambda m, b: (m(b).float() * m.scale).pow(2).sum((1, 2))  # noqa: E731
    x = torch.randn(4, 5, 6).to(torch.bfloat16)
    from dprc_core.hooks import PerSampleHooks
    from dprc_core.independence import check_sample_independence

    hooks = PerSampleHooks(model, verified_layouts=True)
    check_sample_independence(hooks, loss, x)
    hooks.remove()
    assert list(model.parameters()) == params  # the same tensors
    for k, v in model.state_dict().items():
        assert v.dtype == before[k].dtype, k
        assert torch.equal(v, before[k]), k
