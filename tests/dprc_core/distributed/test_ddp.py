"""Data-parallel DP-SGD on 2 gloo ranks (CPU) against single-process references.

The scenarios (tests/dprc_core/distributed/ddp_scenarios.py) run in one real ``torchrun`` job
(``ddp_out``, tests/dprc_core/distributed/conftest.py) with a timeout, so a rank that waits on a
collective the other skipped fails the tests instead of hanging them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dprc_core.clipping import Clipping, Hutch
from dprc_core.distributed import refuse_wrapped_model
from dprc_core.engine import PrivacyEngine
from dprc_core.noise import Gaussian
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler
from tests.dprc_core.distributed import ddp_scenarios as sc


@pytest.fixture(scope="module")
def steps_out(ddp_out) -> Path:
    return ddp_out("steps")


@pytest.mark.parametrize("method", sc.METHODS)
@pytest.mark.parametrize("micro", [None, 2])
def test_two_ranks_take_the_single_process_step_on_the_union_batch(steps_out, method, micro):
    model, data = sc.build_case()
    engine = sc.make_engine(model, method, sigma=0.0)
    ref_stats = sc.run_steps(engine, data, sc.BATCHES, micro=None)
    ref = {n: p.detach() for n, p in model.named_parameters()}
    tag = f"steps-{method.replace('/', '-')}-{micro}"
    for rank in (0, 1):
        got = load_file(str(steps_out / f"{tag}-rank{rank}.safetensors"))
        for name, want in ref.items():
            scale = want.abs().max().item()
            err = (got[name] - want).abs().max().item()
            assert err <= 1e-12 * max(scale, 1.0), (rank, name, err)
        stats = json.loads((steps_out / f"{tag}-rank{rank}.json").read_text())
        # the counts and the mean loss are the whole logical batch's on every rank
        assert [s["batch_size"] for s in stats] == [len(b) for b in sc.BATCHES]
        for s, r in zip(stats, ref_stats, strict=True):
            assert math.isclose(s["mean_loss"], r["mean_loss"], rel_tol=1e-12)
    # the second batch leaves rank 1 empty: the case is really covered
    assert all(i % 2 == 0 for i in sc.BATCHES[1])


def test_the_noise_is_drawn_once_with_the_single_process_law(ddp_out):
    tmp_path = ddp_out("noise")
    w0 = load_file(str(tmp_path / "noise-rank0.safetensors"))["w"]
    w1 = load_file(str(tmp_path / "noise-rank1.safetensors"))["w"]
    assert torch.equal(w0, w1)  # every rank takes the same update
    # the update is -noise/(qN): its sd must be sigma*C/(qN) once, not sqrt(2) (two full
    # independent draws summed) nor 1/sqrt(2) or 1/2 (a per-rank share), within a bound from
    # the sample size: the sample variance of n normals has relative sd sqrt(2/n)
    noise = -w0.flatten() * 3.0
    n = noise.numel()
    ratio = float(noise.var(unbiased=True)) / (1.5 * 2.0) ** 2
    assert abs(ratio - 1) < 6 * math.sqrt(2 / n), ratio  # 6 sd: ~3.8% at n = 100 000
    assert abs(float(noise.mean())) < 6 * 3.0 / math.sqrt(n)
    # and it is the very draw a single process with the same seed makes
    torch.manual_seed(0)
    model = nn.Linear(400, 250, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    engine = PrivacyEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        clipping=Clipping(2.0, Hutch()),
        noise=Gaussian(1.5),
        expected_batch_size=3.0,
        seed=11,
    )
    engine.step()
    assert torch.equal(model.weight.detach(), w0)


def test_nu_dpftrl_on_two_ranks_is_the_single_process_run(ddp_out):
    """The correlated noise exists once (rank 0's state), so 2 ranks on fixed-order batches
    take the single process's noisy steps."""
    tmp_path = ddp_out("dpftrl")
    model, data = sc.build_case()
    engine = sc.make_engine(model, "exact", sigma=0.8, nu=0.3)
    batches = [b.tolist() for b in FixedOrderSampler(sc.N_EXAMPLES, 4, steps=5, seed=2)]
    sc.run_steps(engine, data, batches, micro=None)
    for rank in (0, 1):
        got = load_file(str(tmp_path / f"dpftrl-rank{rank}.safetensors"))
        for name, want in model.named_parameters():
            err = (got[name] - want.detach()).abs().max().item()
            assert err <= 1e-12 * max(want.abs().max().item(), 1.0), (rank, name, err)


def test_the_ranks_parts_are_exactly_the_single_process_batches(ddp_out):
    tmp_path = ddp_out("sampler")
    parts = [json.loads((tmp_path / f"sampler-rank{r}.json").read_text()) for r in (0, 1)]
    single = [t.tolist() for t in PoissonSampler(50, 0.1, 40, seed=5)]
    assert len(parts[0]["explicit"]) == len(parts[1]["explicit"]) == 40  # every rank, every step
    empty_steps = 0
    for step, whole in enumerate(single):
        a, b = parts[0]["explicit"][step], parts[1]["explicit"][step]
        assert not set(a) & set(b)
        assert sorted(a + b) == sorted(whole)
        empty_steps += (not a) or (not b)
    assert empty_steps > 0  # some step left a rank with nothing, and it still took the step
    assert parts[0]["fresh_seed"] == parts[1]["fresh_seed"]  # rank 0's OS seed, shared
    fixed = [t.tolist() for t in FixedOrderSampler(23, 5, steps=9, seed=3)]
    for step, whole in enumerate(fixed):
        a, b = parts[0]["fixed"][step], parts[1]["fixed"][step]
        assert sorted(a + b) == sorted(whole) and not set(a) & set(b)


def test_a_model_wrapped_in_ddp_is_refused(tmp_path):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
        with pytest.raises(ValueError, match="DistributedDataParallel"):
            refuse_wrapped_model(wrapped)
        with pytest.raises(ValueError, match="DistributedDataParallel"):
            PrivacyEngine(
                wrapped,
                torch.optim.SGD(wrapped.parameters(), lr=0.1),
                clipping=Clipping(1.0, Hutch()),
                noise=Gaussian(1.0),
                expected_batch_size=2.0,
            )
    finally:
        torch.distributed.destroy_process_group()
