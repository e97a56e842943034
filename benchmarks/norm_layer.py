"""Per-sample gradient norm of one linear layer: extra memory, time and FLOPs per method.

The paper's Figure 2/3/13 setting (docs/design.md §5): batch B = 2, sequence T = 4096, layers
(p × d) 2048×2048, 8192×2048, 2048×512; methods fgc, ghost, exact and hutch / hutchpp with
k ∈ {8, 32, 64, 128}. For each configuration a **fresh process** (this script with ``--one``)

1. creates A (B, T, d) and G (B, T, p) in float32 and warms the kernels up on tiny inputs;
2. CPU: resets the peak RSS (``echo 5 > /proc/self/clear_refs`` resets VmHWM; checked at start,
   else a 1 ms RSS-sampling thread is used), records the RSS after the inputs exist, runs
   ``matrix_sq_norms([MatrixContribution(G, A)], method, ...)`` once and reports
   ``peak RSS − post-input RSS``; CUDA: ``max_memory_allocated − memory_allocated``;
3. times further runs in a separate loop (default thread count) and reports the median.

FLOPs are analytic counts of the matrix products (the paper's Figure 3 metric). The target
check compares hutch k=32 with ``exact`` on 8192×2048 (extra memory from the per-config runs;
time as the median ratio of an interleaved A/B/A/B… run in one process, docs/design.md §5).

    python benchmarks/norm_layer.py             # full run (~5-10 min on 2 cores)
    python benchmarks/norm_layer.py --quick     # T = 1024, k = 32 only
    python benchmarks/norm_layer.py --device cuda
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.kit.device import hwm_reset_works, sync  # noqa: E402
from benchmarks.kit.memory import (  # noqa: E402
    MIB,
    PeakRSS,
    peak_rss_bytes,
    reset_peak,
    rss_bytes,
)
from benchmarks.kit.pages import cpu_model  # noqa: E402
from dprc_core.estimators import MatrixContribution  # noqa: E402
from dprc_core.norm_methods import matrix_sq_norms  # noqa: E402

SHAPES = ((2048, 2048), (8192, 2048), (2048, 512))  # (p, d): weight out × in
KS = (8, 32, 64, 128)
EXACT = ("fgc", "ghost", "exact")
SKETCH = ("hutch", "hutchpp")
TARGET_SHAPE, TARGET_K = (8192, 2048), 32
TARGET_MEM, TARGET_TIME = 0.02, 0.10


# --------------------------------------------------------------------------------------------
# Memory probes
# --------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------
# One configuration (runs in a fresh process)
# --------------------------------------------------------------------------------------------
def make_inputs(b: int, t: int, p: int, d: int, device: torch.device):
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(b, t, d, generator=gen, device=device, dtype=torch.float32)
    g = torch.randn(b, t, p, generator=gen, device=device, dtype=torch.float32)
    return a, g


def runner(a: torch.Tensor, g: torch.Tensor, method: str, k: int) -> Callable[[], str]:
    contribs = [MatrixContribution(g, a)]  # nn.Linear: left = G (B,T,p), right = A (B,T,d)
    gen = torch.Generator(device=a.device).manual_seed(1)

    def run() -> str:
        norms, used = matrix_sq_norms(contribs, method, k=k, generator=gen, dtype=torch.float32)
        assert norms.shape == (a.shape[0],)
        return used

    return run


def time_runs(run: Callable[[], str], device: torch.device, min_reps: int, budget_s: float):
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < 25):
        sync(device)
        t0 = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def one(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    method, p, d, k = args.one[0], int(args.one[1]), int(args.one[2]), int(args.one[3])
    # warm-up on tiny inputs: thread pools, BLAS/LAPACK and lazy initialisation, without
    # leaving large freed blocks behind that the measured run could reuse
    wa, wg = make_inputs(1, 16, min(p, 64), min(d, 64), device)
    runner(wa, wg, method, min(k, 8))()
    del wa, wg
    a, g = make_inputs(args.batch, args.seq, p, d, device)
    run = runner(a, g, method, k)
    gc.collect()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        used = run()
        sync(device)
        extra, probe = torch.cuda.max_memory_allocated(device) - base, "cuda_max_allocated"
    elif hwm_reset_works():
        gc.collect()
        reset_peak()
        base = rss_bytes()
        used = run()
        extra, probe = peak_rss_bytes() - base, "VmHWM"
    else:
        base = rss_bytes()
        with PeakRSS(every=0.001, reset_hwm=False) as sampler:
            used = run()
        extra, probe = sampler.peak() - base, "rss_sampler"
    times = time_runs(run, device, args.reps, args.budget)
    return {
        "method": method,
        "p": p,
        "d": d,
        "k": k,
        "used": used,
        "extra_bytes": max(extra, 0),
        "base_rss_bytes": base,
        "probe": probe,
        "time_s": statistics.median(times),
        "times_s": times,
        "threads": torch.get_num_threads(),
    }


def ab(args: argparse.Namespace) -> dict:
    """Interleaved timing exact, hutch, exact, hutch, … in one process; median ratio."""
    device = torch.device(args.device)
    p, d, k = (int(x) for x in args.ab)
    a, g = make_inputs(args.batch, args.seq, p, d, device)
    runs = {"exact": runner(a, g, "exact", k), "hutch": runner(a, g, "hutch", k)}
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list[float]] = {"exact": [], "hutch": []}
    for _ in range(args.ab_rounds):
        for name, run in runs.items():
            times[name].extend(time_runs(run, device, 1, 0.0))
    ratios = [h / e for h, e in zip(times["hutch"], times["exact"], strict=True)]
    return {"times_s": times, "ratio": statistics.median(ratios)}


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def flops(method: str, b: int, t: int, p: int, d: int, k: int) -> float:
    """Analytic FLOPs (multiply-add = 2) of the norm computation for a (p × d) layer."""
    n, m = max(p, d), min(p, d)  # the sketch projects the larger dimension
    if method == "fgc":
        return 2 * b * t * p * d + 2 * b * p * d
    if method == "ghost":
        return 2 * b * t * t * (p + d) + 2 * b * t * t
    if method == "hutch":  # X P (B·T·n·k), Yᵀ(XP) (B·T·m·k), squares
        return 2 * b * t * (n + m) * k + 2 * b * m * k
    if method == "hutchpp":  # MᵀS, M(MᵀS), MᵀQ, MᵀP; QR (with Q formed); QᵀP, (MᵀQ)(QᵀP)
        qr = 4 * n * k * k - 4 * k**3 / 3
        return b * (8 * t * (n + m) * k + qr + 2 * n * k * k + 2 * m * k * k + 4 * m * k)
    raise ValueError(method)


@dataclass
class Row:
    p: int
    d: int
    method: str
    k: int | None
    used: str
    extra: int
    time_s: float
    gflop: float


def spawn(extra_args: list[str], args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        *extra_args,
        "--device",
        args.device,
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--reps",
        str(args.reps),
        "--budget",
        str(args.budget),
        "--ab-rounds",
        str(args.ab_rounds),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def configs(quick: bool) -> list[tuple[int, int, str, int | None]]:
    ks = (TARGET_K,) if quick else KS
    out: list[tuple[int, int, str, int | None]] = []
    for p, d in SHAPES:
        out += [(p, d, m, None) for m in EXACT]
        out += [(p, d, m, k) for m in SKETCH for k in ks]
    return out


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    cpu = cpu_model(platform.processor() or "cpu")
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def pct(x: float, ref: float) -> str:
    return f"{100 * x / ref:.2f}%" if ref > 0 else "n/a"


def render(rows: list[Row], args: argparse.Namespace, ab_res: dict | None) -> tuple[str, str]:
    exact = {(r.p, r.d): r for r in rows if r.method == "exact"}
    lines = [
        f"## Per-sample norm of one linear layer (B={args.batch}, T={args.seq}, float32, "
        f"{args.device})",
        "",
        f"Machine: {machine(args.device)}. Extra memory = peak minus the memory after A, G "
        "exist, one fresh process per row; time = median of repeated runs; FLOPs analytic; "
        "percentages relative to `exact` on the same layer (`exact` = the cheaper of "
        "fgc/ghost by fastDP's rule, shown in *used*). Single timings are noisy on a shared "
        "machine; the target's time ratio comes from interleaved A/B runs in one process.",
        "",
        "| layer p×d | method | k | used | extra memory (MiB) | % of exact | time (ms) "
        "| % of exact | GFLOP | % of exact |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e = exact[(r.p, r.d)]
        lines.append(
            f"| {r.p}×{r.d} | {r.method} | {r.k if r.k is not None else '–'} | {r.used} "
            f"| {r.extra / MIB:.1f} | {pct(r.extra, e.extra)} | {1e3 * r.time_s:.1f} "
            f"| {pct(r.time_s, e.time_s)} | {r.gflop:.2f} | {pct(r.gflop, e.gflop)} |"
        )
    tp, td = TARGET_SHAPE
    h = next(r for r in rows if (r.p, r.d, r.method, r.k) == (tp, td, "hutch", TARGET_K))
    e = exact[(tp, td)]
    mem_ratio = h.extra / e.extra
    time_ratio = ab_res["ratio"] if ab_res else h.time_s / e.time_s
    ok = mem_ratio <= TARGET_MEM and time_ratio <= TARGET_TIME
    off_target = (args.batch, args.seq) != (2, 4096)
    verdict = (
        ("(informational: the target is defined at B=2, T=4096) " if off_target else "")
        + f"{'PASS' if ok else 'FAIL'}: hutch k={TARGET_K} on {tp}×{td} (T={args.seq}) uses "
        f"{100 * mem_ratio:.2f}% of exact's extra memory (target ≤ {100 * TARGET_MEM:.0f}%) and "
        f"{100 * time_ratio:.2f}% of its time (target ≤ {100 * TARGET_TIME:.0f}%; median of "
        f"{'interleaved A/B runs' if ab_res else 'per-config medians'}); FLOPs "
        f"{100 * h.gflop / e.gflop:.2f}%."
    )
    lines += [
        "",
        f"**Target:** hutch k={TARGET_K} on {tp}×{td} uses at most {100 * TARGET_MEM:.0f}% of the "
        f"extra memory of `exact` and at most {100 * TARGET_TIME:.0f}% of its time.",
        "",
        f"**{verdict}**",
        "",
        f"Paper (Fig. 13 / Fig. 3, A100): hutch k=32 on 8192×2048 cuts the extra memory by 99.22% "
        f"(here {100 * (1 - mem_ratio):.2f}%) and FLOPs by 98.05% "
        f"(here {100 * (1 - h.gflop / e.gflop):.2f}%).",
    ]
    return "\n".join(lines) + "\n", verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", nargs=4, metavar=("METHOD", "P", "D", "K"), help=argparse.SUPPRESS)
    ap.add_argument("--ab", nargs=3, metavar=("P", "D", "K"), help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="T=1024 and k=32 only")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default 4096)")
    ap.add_argument("--reps", type=int, default=3, help="minimum timed repetitions")
    ap.add_argument("--budget", type=float, default=2.0, help="timing budget per config (s)")
    ap.add_argument("--ab-rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "norm_layer.md")
    args = ap.parse_args()
    if args.seq is None:
        args.seq = 1024 if args.quick else 4096
    if args.quick:
        args.budget, args.ab_rounds = min(args.budget, 0.5), min(args.ab_rounds, 3)
    if args.one:
        print(json.dumps(one(args)))
        return
    if args.ab:
        print(json.dumps(ab(args)))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device available")

    rows: list[Row] = []
    todo = configs(args.quick)
    t_start = time.perf_counter()
    for i, (p, d, method, k) in enumerate(todo, 1):
        res = spawn(["--one", method, str(p), str(d), str(k or TARGET_K)], args)
        row = Row(
            p,
            d,
            method,
            k,
            res["used"],
            res["extra_bytes"],
            res["time_s"],
            flops(
                res["used"] if method == "exact" else method,
                args.batch,
                args.seq,
                p,
                d,
                k or TARGET_K,
            )
            / 1e9,
        )
        rows.append(row)
        print(
            f"[{i}/{len(todo)} {time.perf_counter() - t_start:6.0f}s] {p}×{d} {method:8s} "
            f"k={k or '-':>4} used={row.used:6s} extra={row.extra / MIB:8.1f} MiB "
            f"time={1e3 * row.time_s:9.1f} ms  ({res['probe']})",
            flush=True,
        )
    ab_res = spawn(["--ab", *map(str, TARGET_SHAPE), str(TARGET_K)], args)
    table, verdict = render(rows, args, ab_res)
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
