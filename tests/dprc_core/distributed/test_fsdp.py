"""FSDP2-sharded DP-SGD (issue 29) on 2 and 3 gloo ranks (CPU, float64), the scenarios
(tests/dprc_core/distributed/fsdp_scenarios.py) run in one real ``torchrun`` job a world size
(``fsdp_out``, tests/dprc_core/distributed/conftest.py) with a timeout, against single-process
references built here:

* σ = 0: the sharded ranks take the single process's step on the union batch, to 1e-10 — exact
  and per-example Hutchinson norms, with and without micro-batches, with a rank whose part is
  empty, full fine-tuning and LoRA over a sharded frozen base;
* σ > 0: each coordinate of the update is noised once, with variance (σC/qN)² within
  6·√(2/n) (n ≥ 100,000 coordinates), plain and secure; a mutant that noises on every rank is
  caught by the same check;
* memory: each rank's local parameter and Adam-state bytes are at most 1/W of the whole plus
  one row of each tensor (the uneven split's remainder).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.dprc_core.distributed import fsdp_scenarios as sc


@pytest.fixture(scope="module", params=[2, 3])
def steps_out(request, fsdp_out) -> tuple[Path, int]:
    return fsdp_out(request.param, "steps"), request.param


@functools.cache
def _reference(folder: Path, method: str, lora: bool) -> tuple[dict, list[dict], float]:
    """The single process's steps on the union batches from the launch's model (they do not
    depend on the ranks' micro-batches): its trainable weights after them, its step stats, and
    how far the weights moved."""
    model = sc.llama(folder, lora)
    engine = sc.make_engine(model, method)
    ref_stats = sc.run_steps(engine, sc.BATCHES, micro=None)
    ref = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    moved = 0.0
    initial = sc.llama(folder, lora)
    for name, p in initial.named_parameters():
        if p.requires_grad:
            moved = max(moved, (ref[name] - p.detach()).abs().max().item())
    return ref, ref_stats, moved


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("method", sc.METHODS)
@pytest.mark.parametrize("micro", [None, 2])
def test_sharded_ranks_take_the_single_process_step_on_the_union_batch(
    steps_out, method, micro, lora
):
    out, world = steps_out
    ref, ref_stats, moved = _reference(out / "llama", method, lora)
    assert moved > 1e-4  # the steps really moved the weights
    tag = f"steps-{'lora-' if lora else ''}{method.replace('/', '-')}-{micro}"
    for rank in range(world):
        got = load_file(str(out / f"{tag}-rank{rank}.safetensors"))
        assert set(got) == set(ref), set(got) ^ set(ref)
        for name, want in ref.items():
            err = (got[name] - want).abs().max().item()
            assert err <= 1e-10 * max(want.abs().max().item(), 1.0), (rank, name, err)
        stats = json.loads((out / f"{tag}-rank{rank}.json").read_text())
        assert [s["batch_size"] for s in stats] == [len(b) for b in sc.BATCHES]
        for s, r in zip(stats, ref_stats, strict=True):
            assert math.isclose(s["mean_loss"], r["mean_loss"], rel_tol=1e-10)
    # the second batch leaves every rank but 0 empty: the case is really covered
    assert all(i % world == 0 for i in sc.BATCHES[1])


def _variance_ratio(path: Path) -> tuple[float, int]:
    w = load_file(str(path))["0.weight"]
    n = w.numel()
    want = (sc.NOISE_SIGMA * sc.NOISE_C / sc.NOISE_QN) ** 2
    return float(w.pow(2).mean()) / want, n


@pytest.mark.parametrize("world", [2, 3])
def test_each_coordinate_is_noised_once_with_the_single_process_law(fsdp_out, world):
    tmp_path = fsdp_out(world, "noise")
    for kind in ("plain", "secure"):
        ratios = [
            _variance_ratio(tmp_path / f"noise-{kind}-rank{r}.safetensors") for r in range(world)
        ]
        (ratio, n), *others = ratios
        assert n >= 100_000
        assert abs(ratio - 1) <= 6 * math.sqrt(2 / n), (kind, ratio)
        assert all(o == (ratio, n) for o in others)  # every rank holds the same whole update
        w = load_file(str(tmp_path / f"noise-{kind}-rank0.safetensors"))["0.weight"]
        # the rows of different ranks are independent draws, not copies of one stream
        rows = -(-w.shape[0] // world)
        assert not torch.allclose(w[:rows], w[rows : 2 * rows])
    mutant, n = _variance_ratio(tmp_path / "noise-mutant-rank0.safetensors")
    assert abs(mutant - 1) > 6 * math.sqrt(2 / n), mutant  # W draws a coordinate: caught
    assert mutant == pytest.approx(
        1 + world * (sc.NOISE_QN / sc.NOISE_QN) ** 2 * 0 + world, rel=0.05
    )


@pytest.mark.parametrize("world", [2, 3])
def test_local_parameters_and_optimizer_state_are_a_wth_of_the_whole(fsdp_out, world):
    tmp_path = fsdp_out(world, "memory")
    shapes = json.loads((tmp_path / "memory-rank0.json").read_text())["shapes"]
    whole = sum(math.prod(shape) * size for shape, size in shapes.values())
    row = sum(math.prod(shape[1:]) * size for shape, size in shapes.values())
    for rank in range(world):
        m = json.loads((tmp_path / f"memory-rank{rank}.json").read_text())
        # Adam: the parameters and two moments, each split by rows
        assert m["params"] <= whole / world + row, (rank, m["params"], whole)
        assert m["state"] <= 2 * (whole / world + row), (rank, m["state"], whole)
        assert m["state"] > 0


def test_what_a_sharded_engine_refuses_it_refuses_on_every_rank(fsdp_out):
    tmp_path = fsdp_out(2, "refusals")
    for rank in (0, 1):
        found = json.loads((tmp_path / f"refusals-rank{rank}.json").read_text())
        # a float32 model whose samples mix: refused by the check in its own dtypes
        assert found["mixing"].startswith("SampleMixingError") and "sharding" in found["mixing"]
        assert "two_pass" in found["two_pass"] and "reduce-scatter" in found["two_pass"]
        assert found["nu_dpftrl"].startswith("ValueError") and "sharded" in found["nu_dpftrl"]
        assert "pad(loss_fn, batch)" in found["empty"]
        assert "fully_shard the root module too" in found["partly"]


def test_bf16_mixed_precision_takes_the_float32_step_to_bf16_accuracy(fsdp_out):
    tmp_path = fsdp_out(2, "mixed")
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.float32)
    engine = sc.make_engine(model, "exact")
    sc.run_steps(engine, sc.BATCHES, micro=None)
    start = dict(initial.named_parameters())
    got = load_file(str(tmp_path / "mixed-rank0.safetensors"))
    update = torch.cat(
        [(p.detach() - start[n].detach()).flatten() for n, p in model.named_parameters()]
    )
    mixed = torch.cat([(got[n] - start[n].detach()).flatten() for n, _ in model.named_parameters()])
    assert all(got[n].dtype == torch.float32 for n in got)  # float32 master weights
    rel = float((mixed - update).norm() / update.norm())
    assert 0 < rel < 0.05, rel  # computed in bfloat16 (not bit-equal), within its accuracy
