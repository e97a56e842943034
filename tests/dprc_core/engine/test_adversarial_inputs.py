"""Adversarial cases (issue: privacy bugs found by adversarial testing). Each test failed on the
engine before the fix."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import (
    Auto,
    Clipping,
    Exact,
    Gaussian,
    Hutch,
    HutchPP,
    NuDPFTRL,
    SampleMixingError,
    UnsupportedModuleError,
)
from dprc_core.accounting import noise_multiplier
from dprc_core.clipping import norm_from_method


def _engine(model, clipping=None, noise=None, **kw):
    """An engine with exact clipping at C = 1 and σ = 0 unless ``clipping`` / ``noise`` say
    otherwise."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    args = dict(
        clipping=Clipping(1.0, Exact()) if clipping is None else clipping,
        noise=Gaussian(0.0) if noise is None else noise,
        expected_batch_size=1,
        seed=0,
    )
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dprc_core.PrivacyWarning)
        return dprc_core.PrivacyEngine(model, opt, **args)


def _reference_clipped_update(model, loss_fn, xs, clip, expected_b):
    """Σ_i min(1, C/‖g_i‖) g_i / B from plain autograd, one sample at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for i in range(xs.shape[0]):
        g = torch.autograd.grad(loss_fn(model, xs[i : i + 1])[0], params)
        norm = torch.sqrt(sum(t.pow(2).sum() for t in g))
        c = min(1.0, clip / float(norm))
        for acc, t in zip(total, g):
            acc += c * t
    return [t / expected_b for t in total]


# ------------------------------------------------------------ 1. subclasses of layers
class Scaled(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 3.0


class PlainSubclass(nn.Linear):
    """Does not override forward: the Linear math applies."""


def test_subclass_overriding_forward_is_refused_naming_module_and_class():
    net = nn.Sequential(Scaled(8, 8)).double()
    with pytest.raises(UnsupportedModuleError, match=r"'0' of type Scaled .*overrides forward"):
        _engine(net, clipping=Clipping(1.0, Exact(), clipped_sum="two_pass"))
    with pytest.raises(UnsupportedModuleError, match="Scaled"):
        dprc_core.per_sample_grad_norms(
            net,
            lambda m, b: m(b).pow(2).flatten(1).sum(1),
            torch.randn(2, 5, 8, dtype=torch.float64),
        )


def test_subclass_without_own_forward_uses_the_base_math():
    torch.manual_seed(0)
    net = nn.Sequential(PlainSubclass(8, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    loss = lambda m, b: m(b).pow(2).flatten(1).sum(1)  # noqa: E731
    x = torch.randn(4, 5, 8, dtype=torch.float64)
    want = _reference_clipped_update(net, loss, x, 0.5, 4.0)
    before = [p.detach().clone() for p in net.parameters()]
    _engine(net, clipping=Clipping(0.5, Exact()), expected_batch_size=4).step(loss, x)
    for p0, p, w in zip(before, net.parameters(), want):
        torch.testing.assert_close(p0 - p.detach(), w, rtol=1e-10, atol=1e-12)


def test_update_of_one_sample_never_exceeds_the_clip_norm():
    """The issue's repro, with a registered handler-free subclass refused, and a supported
    model: one sample moves the model by at most C / B (σ = 0, lr = 1)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)).double()
    before = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
    _engine(net).step(
        lambda m, b: 30 * m(b).pow(2).flatten(1).sum(1), torch.randn(1, 5, 8, dtype=torch.float64)
    )
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    assert float((before - after).norm()) <= 1.0 + 1e-9


def test_weight_norm_is_refused_at_construction():
    lin = nn.Linear(4, 3).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates the legacy weight_norm
        lin = torch.nn.utils.weight_norm(lin)
    with pytest.raises(UnsupportedModuleError, match=r"weight_g.*weight_v|weight_norm"):
        _engine(nn.Sequential(lin))


def test_multihead_attention_with_trainable_out_proj_is_refused_clearly():
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    mha.in_proj_weight.requires_grad_(False)
    mha.in_proj_bias.requires_grad_(False)
    assert any(p.requires_grad for p in mha.out_proj.parameters())
    with pytest.raises(UnsupportedModuleError, match="MultiheadAttention.*functionally"):
        _engine(nn.ModuleDict({"attn": mha}))


# ----------------------------------------------------------------- 2. non-finite samples
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _mse(model, batch):
    return model(batch).pow(2).sum(-1)


@pytest.mark.parametrize("mode", ["bookkeeping", "two_pass"])
@pytest.mark.parametrize("where", [0, 2])
def test_a_nan_sample_is_dropped_and_the_update_stays_finite(mode, where):
    torch.manual_seed(0)
    net = Net().double()
    x = torch.randn(4, 6, dtype=torch.float64)
    bad = x.clone()
    bad[where, 1] = float("nan")
    keep = torch.tensor([i for i in range(4) if i != where])
    want = _reference_clipped_update(net, _mse, x[keep], 0.7, 4.0)
    before = [p.detach().clone() for p in net.parameters()]
    stats = _engine(
        net, clipping=Clipping(0.7, Exact(), clipped_sum=mode), expected_batch_size=4
    ).step(_mse, bad)
    assert stats.dropped == 1 and stats.batch_size == 4
    assert math.isfinite(stats.mean_loss)
    for p0, p, w in zip(before, net.parameters(), want):
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p0 - p.detach(), w, rtol=1e-10, atol=1e-12)


def test_an_inf_norm_sample_contributes_nothing_and_noise_still_applies():
    torch.manual_seed(0)
    net = Net().double()
    x = torch.randn(3, 6, dtype=torch.float64)
    x[1] = 1e200  # finite input, overflowing gradient
    stats = _engine(net, noise=Gaussian(1.0), expected_batch_size=3).step(_mse, x)
    assert stats.dropped >= 1
    assert all(torch.isfinite(p).all() for p in net.parameters())


# -------------------------------------------------------- 3. samples that are not independent
class SeqFirst(nn.Module):
    """Applies its Linear to a sequence-first (T, B, d) view of a batch-first input."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x.transpose(0, 1)).transpose(0, 1)


class SeqMajorFlat(nn.Module):
    """Flattens (B, T, d) sequence-major to (T·B, d) before its Linear: read batch-major,
    rows of different samples would be mixed."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        b, t, d = x.shape
        h = self.lin(x.transpose(0, 1).reshape(t * b, d))
        return h.reshape(t, b, -1).transpose(0, 1)


def test_sequence_major_flattened_layout_is_refused():
    x = torch.randn(4, 3, 4, dtype=torch.float64)
    with pytest.raises(SampleMixingError, match="not independent"):
        _engine(SeqMajorFlat().double()).step(_seq_loss, x)


class BatchCentering(nn.Module):
    """Subtracts the batch mean (like BatchNorm in training mode): samples mix."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        h = self.lin(x)
        return h - h.mean(0, keepdim=True)


def _seq_loss(model, x):
    return model(x).pow(3).sum((1, 2))


@pytest.mark.parametrize("t", [4, 2])
def test_sequence_first_layout_with_t_equal_to_b_is_refused(t):
    """T == B = 4 passed every shape check and gave norms ~70 % off."""
    x = torch.randn(4, t, 4, dtype=torch.float64) if t == 4 else torch.randn(2, 2, 4).double()
    with pytest.raises((SampleMixingError, ValueError), match="batch-first|independent"):
        _engine(SeqFirst().double()).step(_seq_loss, x)


@pytest.mark.parametrize("norm", [Exact(), Hutch(2), HutchPP(2)], ids=["exact", "hutch", "hutchpp"])
def test_batch_statistics_are_refused_and_the_check_can_be_turned_off(norm):
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    with pytest.raises(SampleMixingError, match="not independent"):
        _engine(BatchCentering().double(), clipping=Clipping(1.0, norm)).step(_seq_loss, x)
    unchecked = Clipping(1.0, Exact(), check_independence=False)
    _engine(BatchCentering().double(), clipping=unchecked).step(_seq_loss, x)


def test_the_check_uses_its_own_projections_not_the_training_ones():
    """Same seed, check on or off: identical sketched norms and updates (the check draws
    nothing from the engine's generators)."""
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    b = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    b.load_state_dict(a.state_dict())
    loss = lambda m, t: m(t).pow(2).sum((1, 2))  # noqa: E731
    checked = Clipping(1.0, Hutch(3))
    unchecked = Clipping(1.0, Hutch(3), check_independence=False)
    sa = _engine(a, clipping=checked, noise=Gaussian(1.0), seed=9).step(loss, x)
    sb = _engine(b, clipping=unchecked, noise=Gaussian(1.0), seed=9).step(loss, x)
    torch.testing.assert_close(sa.per_sample_norms, sb.per_sample_norms, rtol=0, atol=0)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


def test_frozen_batchnorm_in_training_mode_is_refused():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2)).double()
    model[1].requires_grad_(False)
    running = model[1].running_mean.clone()
    with pytest.raises(SampleMixingError):
        _engine(model).step(lambda m, b: m(b).pow(2).sum(-1), torch.randn(6, 4).double())
    torch.testing.assert_close(model[1].running_mean, running)  # buffers restored


def test_independence_check_passes_with_dropout_and_leaves_no_grad():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 2)).double().train()
    engine = _engine(model, expected_batch_size=6)
    stats = engine.step(lambda m, b: m(b).pow(2).sum(-1), torch.randn(6, 4).double())
    assert stats.batch_size == 6 and model[1].training


# ------------------------------------------------------------------ 4. validation
@pytest.mark.parametrize(
    "kwargs, match",
    [  # built inside pytest.raises: the objects refuse bad values where they are written
        (lambda: dict(clipping=Clipping(1.0, Hutch(1))), "k=1|>= 2"),
        (lambda: dict(clipping=Clipping(1.0, HutchPP(1))), ">= 2"),
        (lambda: dict(clipping=Clipping(1.0, Auto(4, k=1))), ">= 2"),
        (lambda: dict(expected_batch_size=math.inf), "expected_batch_size"),
        (lambda: dict(expected_batch_size=True), "expected_batch_size"),
        (lambda: dict(clipping=Clipping(True, Exact())), "max_grad_norm"),
        (lambda: dict(noise=Gaussian(True)), "noise_multiplier"),
        (lambda: dict(clipping=Clipping(1.0, Auto(None))), "max_seq_len"),
        (lambda: dict(clipping=Clipping(1.0, Auto(0))), "max_seq_len"),
    ],
)
def test_bad_engine_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _engine(Net().double(), **kwargs())


def test_k1_is_fine_for_exact_norms_and_noise_zero_warns():
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    with pytest.warns(dprc_core.PrivacyWarning, match="NOT differentially private"):
        dprc_core.PrivacyEngine(
            net,
            opt,
            clipping=Clipping(1.0, norm_from_method("exact", k=1)),
            noise=Gaussian(0.0),
            expected_batch_size=2,
        )


@pytest.mark.parametrize("rel_tol", [0, -1, float("nan"), float("inf"), True, 2.0])
def test_calibration_rel_tol_is_validated(rel_tol):
    with pytest.raises(ValueError, match="rel_tol"):
        noise_multiplier(2.0, 1e-5, sample_rate=0.01, steps=100, rel_tol=rel_tol)


def test_small_sigma_accounting_prints_no_numpy_warnings():
    from dprc_core.accounting import epsilon

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for clipping, k in (("exact", None), ("hutch", 32)):
            assert epsilon(0.05, 0.01, 100, 1e-5, envelope=clipping, k=k) > 100


# ------------------------------------------------------------------ 5. auto, resolved once
class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.Linear(32, 2)
        self.big = nn.Linear(32, 512)

    def forward(self, x):
        return torch.cat([self.big(x), self.small(x)], -1)


def test_auto_with_every_layer_exact_is_accounted_exact():
    """Short sequences, small layers: exact everywhere, so no randomized-clipping envelope."""
    engine = _engine(Net().double(), clipping=Clipping(1.0, Auto(3, k=32)))
    assert set(engine.layer_methods.values()) == {"exact"}
    assert engine.accounting_envelope == "exact" and not engine.randomized


def test_auto_plan_is_fixed_whatever_the_batch_length():
    """Planned for T = 64: the 512×32 layer is sketched (min(2T², p·d) > k(T + p + d)) and stays
    sketched for a batch of T = 2, where a per-batch choice would have picked exact."""
    model = Wide().double()
    engine = _engine(model, clipping=Clipping(1.0, Auto(64, k=4)), expected_batch_size=3)
    methods = engine.layer_methods
    assert methods["big.weight"] == "hutch" and methods["small.weight"] == "exact"
    assert engine.accounting_envelope == "hutch"
    for t in (2, 64):
        stats = engine.step(lambda m, b: m(b).pow(2).sum((1, 2)), torch.randn(3, t, 32).double())
        assert stats.methods["big.weight"] == "hutch"
        assert stats.methods["small.weight"] in ("ghost", "fgc")


# ------------------------------------------------- the handler example of docs/engine.md
class DocScaledLinear(nn.Linear):  # y = 3 · (x Wᵀ + b)
    def forward(self, x):
        return 3.0 * super().forward(x)


def test_the_documented_handler_registration_gives_true_norms():
    from dprc_core.estimators import MatrixContribution
    from dprc_core.layers import LayerHandler

    def capture(module, args, output):
        return args[0].detach()

    def contributions(module, x, g):
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        return {"weight": MatrixContribution(left=3.0 * g, right=x), "bias": 3.0 * g.sum(1)}

    torch.manual_seed(0)
    net = nn.Sequential(DocScaledLinear(6, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    loss = lambda m, b: m(b).pow(2).sum((1, 2))  # noqa: E731
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    with pytest.raises(UnsupportedModuleError, match="DocScaledLinear"):
        dprc_core.per_sample_grad_norms(net, loss, x)
    dprc_core.register(DocScaledLinear)(LayerHandler(capture, contributions))
    params = list(net.parameters())
    ref = torch.stack(
        [
            torch.sqrt(
                sum(g.pow(2).sum() for g in torch.autograd.grad(loss(net, x[i : i + 1])[0], params))
            )
            for i in range(3)
        ]
    )
    for method in ("fgc", "ghost"):
        got = dprc_core.per_sample_grad_norms(net, loss, x, method=method)
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=0)


# ------------------------------------------------------------ correlated noise (nu-DP-FTRL)
@pytest.mark.parametrize(
    "norm", [Hutch(4), HutchPP(4), Auto(4, k=4)], ids=["hutch", "hutchpp", "auto"]
)
def test_nu_dpftrl_refuses_randomized_clipping(norm):
    with pytest.raises(ValueError, match="correlated noise"):
        _engine(Net().double(), clipping=Clipping(1.0, norm), noise=NuDPFTRL(1.0, nu=0.1))


def test_noise_mechanism_arguments_are_validated():
    """About the deprecated keyword form: its noise_mechanism= / nu= are still checked."""

    def keyword_engine(**kw):
        model = Net().double()
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        args = dict(max_grad_norm=1.0, expected_batch_size=1, norm_method="exact", seed=0)
        return dprc_core.PrivacyEngine(model, opt, **args, **kw)

    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="needs nu"):
        keyword_engine(noise_mechanism="nu_dpftrl", noise_multiplier=1.0)
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="apply to noise_mechanism"),
    ):
        keyword_engine(nu=0.1, noise_multiplier=1.0)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="noise_mechanism"):
        keyword_engine(noise_mechanism="laplace", noise_multiplier=1.0)


def test_nu_dpftrl_noise_only_steps_are_correlated_like_its_toeplitz_matrix():
    """Empty batches, lr = 1: the update of step t is -z_t / B with z = B_ν w; the lag-1
    correlation of the updates is β_1 / sqrt(1 + β_1²) · … — here checked against the
    coefficients' own covariance (β_0 β_1 over β_0² for t = 1, un-banded, by Monte Carlo over
    120 000 coordinates: bound 6/sqrt(n))."""
    from dprc_core.accounting.dpftrl import nu_dpftrl_coefficients

    lin = nn.Linear(400, 300, dtype=torch.float64)
    engine = _engine(lin, noise=NuDPFTRL(1.0, nu=0.2), expected_batch_size=1)
    empty = torch.zeros(0, 400, dtype=torch.float64)
    loss = lambda m, b: m(b).sum(-1)  # noqa: E731
    ups = []
    for _ in range(2):
        before = torch.cat([p.detach().flatten().clone() for p in lin.parameters()])
        engine.step(loss, empty)
        ups.append(before - torch.cat([p.detach().flatten() for p in lin.parameters()]))
    b0, b1 = nu_dpftrl_coefficients(0.2, 2)
    z1, z2 = ups  # z_1 = w_1, z_2 = w_2 + β_1 w_1 (σC = 1, B = 1)
    n = z1.numel()
    assert abs(float(z1.pow(2).mean()) - b0**2) <= 6 * (2 / n) ** 0.5
    assert abs(float((z1 * z2).mean()) - b0 * b1) <= 6 * (1 + b1**2) ** 0.5 / n**0.5
    assert abs(float(z2.pow(2).mean()) - (b0**2 + b1**2)) <= 6 * (2 / n) ** 0.5 * (1 + b1**2)
