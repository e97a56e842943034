"""Issue 18: memory and time of per-example against shared sketches on one linear layer.

The norm-layer benchmark's setting (``benchmarks/norm_layer.py``: B = 2, T = 4096, float32, one
nn.Linear of p × d = 8192×2048 and 2048×2048), methods hutch and hutch++ with k ∈ {32, 64},
the projections shared by the batch (one (n, k) matrix from a generator) or per example (a
(B, n, k) stack, ``dprc_core.sketches.ExampleProjections``). Each configuration runs in a fresh
process (this script with ``--one``), measured as norm_layer.py measures: extra memory = peak
RSS (VmHWM reset) minus the RSS once the inputs exist; time = median of repeated runs.
Expected: per-example sketches add B·n·k·4 bytes per draw (transient) and the generation of B
projections instead of one; the products are the same batched matrix products.

    .venv/bin/python benchmarks/sketch_memory.py        # -> docs/benchmarks/sketch_memory.md
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchmarks import norm_layer as nl  # noqa: E402
from benchmarks.kit import device, memory  # noqa: E402
from dprc_core.estimators import MatrixContribution  # noqa: E402
from dprc_core.norm_methods import matrix_sq_norms  # noqa: E402
from dprc_core.sketches import ExampleProjections  # noqa: E402

SHAPES = [(8192, 2048), (2048, 2048)]
METHODS = ("hutch", "hutchpp")
KS = (32, 64)
B, T = 2, 4096


def _runner(a: torch.Tensor, g: torch.Tensor, method: str, sketch: str, k: int):
    contribs = [MatrixContribution(g, a)]
    gen = torch.Generator().manual_seed(1)
    step = [0]

    def run() -> None:
        if sketch == "shared":
            source = gen
        else:
            source = ExampleProjections(
                seed=1, step=step[0], name="w", ids=range(a.shape[0]), device=a.device
            )
            step[0] += 1
        norms, _ = matrix_sq_norms(contribs, method, k=k, generator=source, dtype=torch.float32)
        assert norms.shape == (a.shape[0],)

    return run


def one(method: str, sketch: str, p: int, d: int, k: int) -> dict:
    wa, wg = nl.make_inputs(1, 16, 64, 64, torch.device("cpu"))
    _runner(wa, wg, method, sketch, 8)()
    del wa, wg
    a, g = nl.make_inputs(B, T, p, d, torch.device("cpu"))
    run = _runner(a, g, method, sketch, k)
    gc.collect()
    if device.hwm_reset_works():
        memory.reset_peak()
        base = memory.rss_bytes()
        run()
        extra = memory.peak_rss_bytes() - base
    else:
        base = memory.rss_bytes()
        with memory.PeakRSS(every=0.001, reset_hwm=False) as sampler:
            run()
        extra = sampler.peak() - base
    times = nl.time_runs(run, torch.device("cpu"), 5, 5.0)
    return {
        "method": method,
        "sketch": sketch,
        "p": p,
        "d": d,
        "k": k,
        "extra_bytes": max(extra, 0),
        "time_s": statistics.median(times),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "sketch_memory.md")
    args = ap.parse_args()
    if args.one:
        m, s, p, d, k = args.one
        print(json.dumps(one(m, s, int(p), int(d), int(k))))
        return
    rows = []
    for p, d in SHAPES:
        for method in METHODS:
            for k in KS:
                for sketch in ("shared", "per_example"):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--one",
                        method,
                        sketch,
                        str(p),
                        str(d),
                        str(k),
                    ]
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                    row = json.loads(out.strip().splitlines()[-1])
                    print(row, flush=True)
                    rows.append(row)
    lines = [
        "## Per-example against shared sketches: one linear layer (issue 18)",
        "",
        f"`benchmarks/sketch_memory.py` — {nl.machine('cpu')}. B = {B}, T = {T}, float32, "
        "nn.Linear p × d; extra memory = peak RSS minus the RSS once the inputs exist (a fresh "
        "process per row); time = median of ≥ 5 runs. Per-example: one (n, k) projection per "
        f"example per draw, n = max(p, d) (B·n·k·4 bytes = {B * 8192 * 64 * 4 / 2**20:.0f} MiB "
        "per draw at n = 8192, k = 64).",
        "",
        "| p × d | method | k | extra MiB, shared | extra MiB, per-example | time shared (s) "
        "| time per-example (s) | time ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["p"], r["d"], r["method"], r["k"], r["sketch"]): r for r in rows}
    for p, d in SHAPES:
        for method in METHODS:
            for k in KS:
                s, e = by[(p, d, method, k, "shared")], by[(p, d, method, k, "per_example")]
                lines.append(
                    f"| {p}×{d} | {method} | {k} | {s['extra_bytes'] / 2**20:.1f} | "
                    f"{e['extra_bytes'] / 2**20:.1f} | {s['time_s']:.3f} | {e['time_s']:.3f} | "
                    f"{e['time_s'] / s['time_s']:.2f} |"
                )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
