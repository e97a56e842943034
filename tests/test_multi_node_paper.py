"""benchmarks/multi_node.py's arithmetic against cases derived by hand (issue 46, item 5).
Pure Python: no torch, runs in well under a second."""

from __future__ import annotations

import pytest

from benchmarks.kit import multi_node_paper as mn

ONE_B, EIGHT_B, SEVENTY_B = mn.MODELS


def test_parameter_counts_are_the_published_llama_3_sizes():
    # Llama 3.2 1B (tied), Llama 3.1 8B and 70B (untied), as their model cards count them
    assert ONE_B.params == 1_235_814_400
    assert EIGHT_B.params == 8_030_261_248
    assert SEVENTY_B.params == 70_553_706_496


def test_8b_parts_by_hand():
    # d 4096, kv 8·128 = 1024, f 14336: q, o 2·4096²; k, v 2·4096·1024; MLP 3·4096·14336; norms
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert EIGHT_B.layer_params == per_layer == 218_112_000
    assert EIGHT_B.root_params == 2 * 128256 * 4096 + 4096
    assert EIGHT_B.block_params + EIGHT_B.root_params == EIGHT_B.params


def test_ring_all_reduce_for_two_ranks_is_the_payload():
    # W = 2: each rank sends half in the reduce-scatter and half in the all-gather
    assert mn.ring_all_reduce_bytes(1000.0, 2) == 1000.0
    assert mn.ring_all_reduce_bytes(1000.0, 1) == 0.0
    assert mn.ring_all_reduce_bytes(1000.0, 4) == 1500.0  # 2·3/4


def test_ring_all_gather_is_the_other_ranks_shards():
    assert mn.ring_all_gather_bytes(1600.0, 16) == 1500.0  # 15 shards of 100
    assert mn.ring_all_gather_bytes(1000.0, 1) == 0.0


def test_data_parallel_step_is_one_all_reduce_of_the_bf16_model():
    # 8B, W = 16: 2·15/16 · 8,030,261,248 · 2 bytes
    assert mn.dp_step_bytes(EIGHT_B, 16) == pytest.approx(2 * 15 / 16 * 8_030_261_248 * 2)
    # float32 doubles it
    assert mn.dp_step_bytes(EIGHT_B, 16, width=4) == 2 * mn.dp_step_bytes(EIGHT_B, 16)


def test_fsdp_micro_batch_gathers_and_reduction():
    w, b = 8, 2
    mb = mn.fsdp_micro_batch_bytes(EIGHT_B, w)
    blocks, root, whole = EIGHT_B.block_params * b, EIGHT_B.root_params * b, EIGHT_B.params * b
    assert mb.gather_forward == pytest.approx(7 / 8 * (blocks + root))
    assert mb.gather_backward == pytest.approx(7 / 8 * blocks)
    assert mb.reduce_clipped == pytest.approx(2 * 7 / 8 * whole)
    # about four model-sized transfers of (W-1)/W each: 2 gathers + an all-reduce's two halves
    assert mb.total == pytest.approx(4 * 7 / 8 * whole, rel=0.07)


def test_micro_batches_follow_the_busiest_rank():
    # 1024 sequences over 64 ranks: mean 16, sd 4 -> busiest 28; in micro-batches of 16 -> 2
    assert mn.busiest_share(1024, 64) == 28.0
    assert mn.micro_batches(1024, 64, 16) == 2
    assert mn.micro_batches(1024, 64, 1) == 28


def test_link_time_and_compute_time():
    assert mn.link_seconds(12.5e9, 100) == pytest.approx(1.0)  # 100 Gb/s = 12.5 GB/s
    assert mn.link_seconds(50e9, 400) == pytest.approx(1.0)
    # 6·P_mm·tokens + attention 6·L·T·d·tokens
    tokens = 4 * 8
    flops = mn.step_flops(ONE_B, 4, 8)
    assert flops == 6 * ONE_B.matmul_params * tokens + 6 * 16 * 8 * 2048 * tokens
    assert mn.compute_seconds(989e12 * 0.4 * 2, 2) == pytest.approx(1.0)


def test_memory_fit_verdicts():
    # data-parallel 70B: 4 · 70.55e9 · 2 bytes of state on each GPU
    dp70 = mn.fit(SEVENTY_B, "data-parallel", 16)
    assert dp70.state == 4 * SEVENTY_B.params * 2 and dp70.micro == 0
    fsdp70 = mn.fit(SEVENTY_B, "FSDP2", 64)
    assert fsdp70.state == pytest.approx(4 * SEVENTY_B.params * 2 / 64)
    assert fsdp70.micro >= 1 and not fsdp70.fits_at_load  # the whole model is loaded first
    assert mn.fit(ONE_B, "data-parallel", 16).micro == mn.MICRO_CAP


def test_page_renders_with_every_model_and_link():
    page = mn.render()
    for text in ("1B", "8B", "70B", "100 Gb/s", "400 Gb/s", "arithmetic, not a"):
        assert text in page


def test_the_committed_page_is_the_scripts_output():
    assert mn.PAGE.read_text(encoding="utf-8") == mn.render(), (
        "docs/benchmarks/multi_node.md is stale: run python benchmarks/multi_node.py"
    )
