"""A fixed engine seed must not make the noise a function of the model's initialisation.

``torch.manual_seed(s)`` then ``PrivacyEngine(..., seed=s)`` is the natural way to write a
reproducible script; the engine's noise must nevertheless be independent of the numbers that
``torch.manual_seed(s)`` produces (the initial weights), and of the batch sampler's stream."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dprc_core import PrivacyEngine
from dprc_core.seeding import derive_seed
from dprc_core.training.sampling import PoissonSampler

D = 20_000


def _noise_only_update(seed: int) -> torch.Tensor:
    """The engine's first update when every gradient is zero: the Gaussian noise alone."""
    model = nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(
            model,
            opt,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            expected_batch_size=1.0,
            norm_method="exact",
            seed=seed,
            check_independence=False,
        )
    x = torch.zeros(2, D)
    engine.accumulate(lambda m, b: (m(b) * 0.0).sum(dim=1), x)
    engine.step()
    return -model.weight.detach()[0].clone()


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / (a.norm() * b.norm()))


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_noise_is_not_the_stream_that_initialised_the_model(seed):
    noise = _noise_only_update(seed)
    assert noise.std() == pytest.approx(1.0, rel=0.05)  # σ·C/B = 1: it is the noise
    bound = 5 / D**0.5  # |corr| of independent vectors: ≈ N(0, 1/D)
    for draw in (torch.randn, torch.rand):
        torch.manual_seed(seed)
        init = draw(D)
        assert abs(_corr(noise, init)) < bound, draw
    # nor the stream of a generator seeded with the same integer
    assert abs(_corr(noise, torch.randn(D, generator=torch.Generator().manual_seed(seed)))) < bound


def test_fixed_seed_is_reproducible_and_seeds_differ():
    assert torch.equal(_noise_only_update(7), _noise_only_update(7))
    assert abs(_corr(_noise_only_update(7), _noise_only_update(8))) < 5 / D**0.5


def test_derived_seeds_separate_purposes_and_indices():
    seeds = {derive_seed(s, p, i) for s in (0, 1) for p in ("engine", "sampler") for i in (0, 1)}
    assert len(seeds) == 8 and all(0 <= x < 2**63 for x in seeds)
    assert derive_seed(3, "sampler") == derive_seed(3, "sampler")
    with pytest.raises(TypeError):
        derive_seed(True, "engine")


def test_runner_sampler_stream_is_not_the_engine_stream():
    # the runner seeds its Poisson sampler with derive_seed(seed, "sampler"): its coins are not
    # the engine's noise normals nor torch.manual_seed(seed)'s numbers
    seed = 5
    sampler = PoissonSampler(1000, 0.5, 1, seed=derive_seed(seed, "sampler"))
    coins = torch.rand(1000, generator=sampler.generator)
    torch.manual_seed(seed)
    assert abs(_corr(coins, torch.rand(1000))) < 5 / 1000**0.5
