"""ν-DP-FTRL noise generator: the sequence it produces, its covariance, banding, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dprc_core.noise import NuDPFTRLNoise
from tests.dense_reference import dense_b


def run(noise: NuDPFTRLNoise, shapes, steps: int, gen: torch.Generator, dtype=torch.float32):
    out = []
    for _ in range(steps):
        out.append(
            [noise.sample(i, torch.empty(s, dtype=dtype), gen) for i, s in enumerate(shapes)]
        )
        noise.end_step()
    return out


@pytest.mark.parametrize("nu,bands", [(0.0, None), (0.05, None), (0.3, 3), (0.05, 2), (0.1, 1)])
def test_sequence_is_b_times_the_draws(nu, bands):
    """Replaying the generator gives the draws w; the noise must be B·w exactly."""
    std, steps, shapes = 1.7, 9, [(3, 4), (5,)]
    noise = NuDPFTRLNoise(std, nu, bands)
    got = run(noise, shapes, steps, torch.Generator().manual_seed(3))
    replay = torch.Generator().manual_seed(3)
    w = [[torch.randn(s, generator=replay) * std for s in shapes] for _ in range(steps)]
    b = dense_b(nu, steps, bands)
    for i, _ in enumerate(shapes):
        stacked = np.stack([w[t][i].numpy().ravel() for t in range(steps)]).astype(np.float64)
        expected = b @ stacked
        for t in range(steps):
            np.testing.assert_allclose(got[t][i].numpy().ravel(), expected[t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nu,bands", [(0.02, None), (0.2, 3)])
def test_covariance_across_steps_is_toeplitz_b_bt(nu, bands):
    """Monte Carlo over M independent coordinates: each entry of the empirical covariance
    Ĉ_st = mean(z_s z_t) has standard deviation sqrt((Σ_ss Σ_tt + Σ_st²)/M) for zero-mean
    Gaussians; every entry must lie within 5 of them of Σ = std²·B Bᵀ (P(miss) < 1e-5)."""
    std, steps, m = 0.8, 6, 200_000
    noise = NuDPFTRLNoise(std, nu, bands)
    got = run(noise, [(m,)], steps, torch.Generator().manual_seed(11), dtype=torch.float64)
    z = np.stack([g[0].numpy() for g in got])
    emp = z @ z.T / m
    b = dense_b(nu, steps, bands)
    cov = std**2 * b @ b.T
    sd = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / m)
    assert np.all(np.abs(emp - cov) <= 5 * sd), np.max(np.abs(emp - cov) / sd)
    # the test can tell the banded matrix from the un-banded one (or from independent noise)
    b_other = dense_b(nu, steps, None if bands else 2)
    other = std**2 * b_other @ b_other.T
    assert np.any(np.abs(emp - other) > 10 * sd)
    indep = std**2 * np.eye(steps)
    assert np.any(np.abs(emp - indep) > 10 * sd)


def test_banding_bounds_memory_and_bands_1_is_independent_noise():
    noise = NuDPFTRLNoise(1.0, 0.1, bands=4)
    run(noise, [(2,), (3,)], 20, torch.Generator().manual_seed(0))
    assert all(len(h) == 3 for h in noise._history.values())
    ind = NuDPFTRLNoise(2.0, 0.1, bands=1)
    got = run(ind, [(7,)], 5, torch.Generator().manual_seed(5))
    replay = torch.Generator().manual_seed(5)
    for t in range(5):
        assert torch.equal(got[t][0], torch.randn(7, generator=replay) * 2.0)
    assert all(len(h) == 0 for h in ind._history.values())


@pytest.mark.parametrize("bands", [None, 3])
def test_state_round_trip_resumes_the_same_sequence(tmp_path, bands):
    shapes = [(4, 3), (6,)]
    ref_noise = NuDPFTRLNoise(1.3, 0.05, bands)
    gen = torch.Generator().manual_seed(42)
    reference = run(ref_noise, shapes, 10, gen)

    first = NuDPFTRLNoise(1.3, 0.05, bands)
    gen1 = torch.Generator().manual_seed(42)
    run(first, shapes, 4, gen1)
    save_file(first.state_dict(), tmp_path / "noise.safetensors")  # no pickle
    gen_state = gen1.get_state()

    resumed = NuDPFTRLNoise(1.3, 0.05, bands)
    resumed.load_state_dict(load_file(tmp_path / "noise.safetensors"))
    gen2 = torch.Generator()
    gen2.set_state(gen_state)
    rest = run(resumed, shapes, 6, gen2)
    for t in range(6):
        for i in range(len(shapes)):
            assert torch.equal(rest[t][i], reference[4 + t][i])
    assert resumed.step == 10


def test_state_must_match_the_mechanism():
    noise = NuDPFTRLNoise(1.0, 0.05, 3)
    run(noise, [(2,)], 3, torch.Generator().manual_seed(0))
    state = noise.state_dict()
    for other in (
        NuDPFTRLNoise(1.0, 0.06, 3),
        NuDPFTRLNoise(1.0, 0.05, None),
        NuDPFTRLNoise(1.1, 0.05, 3),
    ):
        with pytest.raises(ValueError, match="state is for"):
            other.load_state_dict(state)
    broken = dict(state)
    del broken["history.0.2"]
    with pytest.raises(ValueError):
        NuDPFTRLNoise(1.0, 0.05, 3).load_state_dict(broken)
    with pytest.raises(ValueError, match="missing"):
        NuDPFTRLNoise(1.0, 0.05, 3).load_state_dict({})


def test_call_contract_is_enforced():
    gen = torch.Generator().manual_seed(0)
    noise = NuDPFTRLNoise(1.0, 0.1)
    noise.sample(0, torch.empty(3), gen)
    with pytest.raises(RuntimeError, match="twice"):
        noise.sample(0, torch.empty(3), gen)
    noise.sample(1, torch.empty(2), gen)
    with pytest.raises(RuntimeError, match="middle of a step"):
        noise.state_dict()
    noise.end_step()
    noise.sample(0, torch.empty(3), gen)
    with pytest.raises(RuntimeError, match="not sampled in earlier steps"):
        noise.sample(2, torch.empty(3), gen)
    with pytest.raises(RuntimeError, match="did not sample"):
        noise.end_step()
    noise2 = NuDPFTRLNoise(1.0, 0.1)
    noise2.sample(0, torch.empty(3), gen)
    noise2.end_step()
    with pytest.raises(RuntimeError, match="changed shape"):
        noise2.sample(0, torch.empty(4), gen)


def test_zero_std_dtypes_and_validation():
    gen = torch.Generator().manual_seed(0)
    zero = NuDPFTRLNoise(0.0, 0.1, 4)
    assert zero.sample(0, torch.empty(3), gen) is None
    zero.end_step()
    noise = NuDPFTRLNoise(1.0, 0.1, 4)
    assert noise.sample(0, torch.empty(3, dtype=torch.float64), gen).dtype == torch.float64
    assert noise.sample(1, torch.empty(3, dtype=torch.bfloat16), gen).dtype == torch.bfloat16
    for bad in (dict(std=-1.0), dict(std=math.inf), dict(nu=-0.1), dict(nu=2.0), dict(bands=0)):
        with pytest.raises(ValueError):
            NuDPFTRLNoise(**(dict(std=1.0, nu=0.1) | bad))
    assert noise.coefficients(3) == pytest.approx([1.0, -0.45, -0.10125])


def test_the_mechanism_object_and_the_deprecated_spelling_add_the_same_noise():
    """``noise=NuDPFTRL(σ, nu, bands)`` is the spelling; the deprecated keyword form's
    ``noise_mechanism="nu_dpftrl", nu=, bands=`` still works, warns, and draws exactly the same
    noise for the same seed."""
    from torch import nn

    import dprc_core
    from dprc_core import Clipping, Exact
    from dprc_core.noise import NuDPFTRL

    def updates(**engine_kw):
        lin = nn.Linear(5, 4, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.zero_()
            lin.bias.zero_()
        opt = torch.optim.SGD(lin.parameters(), lr=1.0)
        engine = dprc_core.PrivacyEngine(lin, opt, expected_batch_size=1, seed=3, **engine_kw)
        empty = torch.zeros(0, 5, dtype=torch.float64)
        for _ in range(3):
            engine.step(lambda m, b: m(b).sum(-1), empty)
        return lin.weight.detach().clone(), engine.noise_mechanism

    keywords = dict(max_grad_norm=1.0, noise_multiplier=1.0, norm_method="exact")
    new, name = updates(clipping=Clipping(1.0, Exact()), noise=NuDPFTRL(1.0, nu=0.3, bands=2))
    with pytest.warns(DeprecationWarning, match="NuDPFTRL"):
        old, _ = updates(**keywords, noise_mechanism="nu_dpftrl", nu=0.3, bands=2)
    assert name == "nu_dpftrl"
    torch.testing.assert_close(new, old, rtol=0, atol=0)
    assert new.abs().sum() > 0
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="inside NuDPFTRL"):
        updates(**keywords, noise_mechanism=NuDPFTRL(nu=0.3), nu=0.3)
