"""benchmarks/fsdp.py --smoke: every configuration runs (single process, FSDP2 on 1 and 2 ranks,
data-parallel on 2), with finite positive step times, and an FSDP2 rank of W = 2 holds at most
half the single process's parameters + Adam state, plus what torch.chunk's row split leaves
over (the issue's criterion)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"single": (1, False), "fsdp_w1": (1, True), "ddp_w2": (2, False), "fsdp_w2": (2, True)}
ADAM_MOMENTS = 2  # exp_avg, exp_avg_sq: shaped like the parameter, sharded with it


def _remainder(shapes: dict[str, list], world: int) -> float:
    """The most a rank can hold beyond 1/W of the parameters + Adam moments: torch.chunk gives
    each rank ⌈n/W⌉ rows of a parameter of n rows (its last rank fewer)."""
    extra = 0.0
    for shape, size in shapes.values():
        rows, row_bytes = shape[0], math.prod(shape[1:]) * size
        extra += (math.ceil(rows / world) - rows / world) * row_bytes * (1 + ADAM_MOMENTS)
    return extra


@pytest.mark.slow
def test_smoke_run_reports_every_configuration_and_fsdp_halves_the_state(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fsdp.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        cwd=ROOT,
        timeout=600,
    )
    report = json.loads((tmp_path / "fsdp.json").read_text())
    configs = report["configs"]
    assert set(configs) == set(CONFIGS)
    for name, (world, sharded) in CONFIGS.items():
        ranks = configs[name]["ranks"]
        assert sorted(r["rank"] for r in ranks) == list(range(world)), name
        for r in ranks:
            assert r["engine_sharded"] is sharded, name
            assert r["step_s"] and all(math.isfinite(s) and s > 0 for s in r["step_s"]), name
            assert math.isfinite(r["median_step_s"]) and r["median_step_s"] > 0, name
            assert r["peak_steps"] > 0 and r["ru_maxrss"] >= r["peak_steps"] * 0.9, name

    single = configs["single"]["ranks"][0]
    whole = single["param_bytes"] + single["optim_bytes"]
    assert single["param_bytes"] == single["whole_param_bytes"]
    assert single["optim_bytes"] == ADAM_MOMENTS * single["whole_param_bytes"]
    bound = whole / 2 + _remainder(report["_meta"]["shapes"], 2)
    fsdp2 = configs["fsdp_w2"]["ranks"]
    for r in fsdp2:
        assert r["param_bytes"] + r["optim_bytes"] <= bound, (r, bound)
    # the shards add up to the whole: nothing dropped, nothing counted twice
    assert sum(r["param_bytes"] for r in fsdp2) == single["param_bytes"]
    assert sum(r["optim_bytes"] for r in fsdp2) == single["optim_bytes"]
    fsdp1 = configs["fsdp_w1"]["ranks"][0]
    assert fsdp1["param_bytes"] + fsdp1["optim_bytes"] == whole

    page = (tmp_path / "fsdp.md").read_text()
    assert "python benchmarks/fsdp.py --smoke" in page
    assert all(f"| {name} |" in page for name in CONFIGS)
