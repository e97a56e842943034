"""Peak memory of the first step (with the per-sample independence check) against a steady step.

The engine runs the per-sample independence check (dprc_core/independence.py) once, inside its
first ``step()``. This benchmark shows what that costs in peak memory: for each configuration
and T, a **fresh process** builds the step benchmark's model (benchmarks/step.py: Llama 4
layers, hidden 256, vocab 4096, float32, B = 2, random tokens), its optimizer, the engine
(hutch k = 32, per-example sketch — the default — book-keeping clipped sums) and the batch,
then

* resets the high-water mark and runs step 1: the **first-step peak** (the check included);
* resets it again and runs steps 2 and 3: the **steady-step peak** (the larger of the two).

Configurations: ``nonprivate`` (plain SGD on the mean loss), ``dprc`` (the check on, the
default) and ``dprc-nocheck`` (``check_independence=False``). Peak on CPU: ``VmHWM`` after
``echo 5 > /proc/self/clear_refs`` (RSS, MiB); each cell runs once with glibc's default
allocator and once with ``MALLOC_MMAP_THRESHOLD_=131072`` (every tensor of 128 KiB or more its
own mapping, returned when freed: the *live* peak, repeatable to < 1 MiB, free of the default
allocator's fragmentation). On CUDA: ``torch.cuda.max_memory_allocated`` reset before each
measured step. "Δ" = peak − the memory in use just before step 1 (model, optimizer, batch).

Usage::

    .venv/bin/python benchmarks/first_step.py                  # T = 2048, 8192; writes the page
    .venv/bin/python benchmarks/first_step.py --seq-lens 2048  # one T
    .venv/bin/python benchmarks/first_step.py --quick --device cuda   # T = 128, prints only
    .venv/bin/python benchmarks/first_step.py --one dprc 2048  # internal: one cell, as JSON
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchmarks import step as step_bench  # noqa: E402
from benchmarks.kit.device import Memory  # noqa: E402
from benchmarks.kit.pages import kept, write_page  # noqa: E402
from dprc_core import PrivacyEngine  # noqa: E402
from dprc_core.clipping import Clipping, norm_from_method  # noqa: E402
from dprc_core.losses import causal_lm_per_sample_loss  # noqa: E402
from dprc_core.noise import Gaussian  # noqa: E402

CONFIGS = ("nonprivate", "dprc", "dprc-nocheck")
SEQ_LENS = (2048, 8192)
QUICK_SEQ_LENS = (128,)
TARGET = 1.05  # first-step peak ≤ 1.05 × steady-step peak (the check on)
OUT = ROOT / "docs" / "benchmarks" / "first_step.md"


def make_step(config: str, seq_len: int, device: torch.device) -> Any:
    model = step_bench.load_model(step_bench.model_dir(), device)
    batch = step_bench.make_batch(seq_len, device)
    opt = torch.optim.SGD(model.parameters(), lr=step_bench.LR)
    if config == "nonprivate":

        def np_step() -> None:
            opt.zero_grad(set_to_none=True)
            causal_lm_per_sample_loss(model, batch).mean().backward()
            opt.step()

        return np_step
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(
            step_bench.MAX_GRAD_NORM,
            norm_from_method("hutch", k=step_bench.K),
            clipped_sum="bookkeeping",
            check_independence=config == "dprc",
        ),
        noise=Gaussian(step_bench.NOISE_MULTIPLIER),
        expected_batch_size=step_bench.BATCH,
        seed=0,
    )
    return lambda: engine.step(causal_lm_per_sample_loss, batch)


def measure_one(config: str, seq_len: int, device: torch.device) -> dict[str, float]:
    """In a fresh process: the first step's peak, then the steady steps' (MiB)."""
    step = make_step(config, seq_len, device)
    memory = Memory(device, checked=True)
    gc.collect()
    base = memory.used_mib()
    memory.reset()
    t0 = time.perf_counter()
    step()
    first_s = time.perf_counter() - t0
    first = memory.peak_mib()
    steady, steady_s = 0.0, []
    for _ in range(2):
        memory.reset()
        t0 = time.perf_counter()
        step()
        steady_s.append(time.perf_counter() - t0)
        steady = max(steady, memory.peak_mib())
    return {
        "base_mib": base,
        "first_mib": first,
        "steady_mib": steady,
        "first_s": first_s,
        "steady_s": min(steady_s),
    }


def in_subprocess(config: str, seq_len: int, device: torch.device, live: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", config, str(seq_len)]
    cmd += ["--device", str(device)]
    env = dict(os.environ)
    if live:
        env["MALLOC_MMAP_THRESHOLD_"] = str(step_bench.LIVE_MMAP_THRESHOLD)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


def _cells(r: dict[str, Any], np_steady: float | None) -> list[str]:
    if "error" in r:
        return [r["error"], "", "", "", ""]
    ratio = r["first_mib"] / r["steady_mib"]
    vs_np = f"{r['first_mib'] / np_steady:.2f}×" if np_steady else "–"
    return [
        f"{r['first_mib']:.0f} (Δ {r['first_mib'] - r['base_mib']:.0f})",
        f"{r['steady_mib']:.0f} (Δ {r['steady_mib'] - r['base_mib']:.0f})",
        f"{ratio:.2f}×",
        vs_np,
        f"{r['first_s']:.1f} / {r['steady_s']:.1f}",
    ]


def render(rows: list[tuple[str, int, str, dict[str, Any]]], device: torch.device) -> list[str]:
    unit = "peak RSS MiB" if device.type == "cpu" else "max allocated MiB"
    lines = [
        f"| config | T | allocator | first step {unit} | steady step {unit} | first ÷ steady "
        "| first ÷ NP steady | s first / steady |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    np_steady = {
        (t, a): r["steady_mib"] for c, t, a, r in rows if c == "nonprivate" and "steady_mib" in r
    }
    for c, t, a, r in rows:
        lines.append("| " + " | ".join([c, str(t), a, *_cells(r, np_steady.get((t, a)))]) + " |")
    return lines


def verdict(rows: list[tuple[str, int, str, dict[str, Any]]]) -> str:
    ratios = [
        (t, a, r["first_mib"] / r["steady_mib"])
        for c, t, a, r in rows
        if c == "dprc" and "first_mib" in r
    ]
    if not ratios:
        return "NOT MEASURED"
    worst = max(x for _, _, x in ratios)
    status = "PASS" if worst <= TARGET else "FAIL"
    detail = ", ".join(f"T={t} {a} {x:.2f}×" for t, a, x in ratios)
    return f"{status}: first-step peak ÷ steady-step peak with the check on: {detail}"


NOTES_START, NOTES_END = "<!-- notes -->", "<!-- /notes -->"


def kept_notes(path: Path) -> str:
    """The hand-written notes between the markers of the current page, kept as they are."""
    return (kept(path, NOTES_START, NOTES_END) or f"{NOTES_START}\n{NOTES_END}") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="T = 128, prints only")
    parser.add_argument("--seq-lens", nargs="+", type=int, default=None)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--no-live", action="store_true", help="CPU: default allocator only")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", nargs=2, metavar=("CONFIG", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), device)), flush=True)
        return 0
    t_start = time.perf_counter()
    step_bench.model_dir()
    seq_lens = args.seq_lens or (QUICK_SEQ_LENS if args.quick else SEQ_LENS)
    allocators = ["default"] + ([] if args.no_live or device.type != "cpu" else ["live"])
    rows = []
    for t in seq_lens:
        for c in args.configs:
            for a in allocators:
                print(f"{c} T={t} {a} …", flush=True)
                r = in_subprocess(c, t, device, live=a == "live")
                print(f"  {r}", flush=True)
                rows.append((c, t, a if device.type == "cpu" else str(device), r))
    table = render(rows, device)
    line = verdict(rows)
    print("\n".join(["", *table, "", line]))
    out = args.out or (None if args.quick or device.type != "cpu" else OUT)
    if out is None:
        return 0
    facts = step_bench.machine_facts(device)
    cmd = " ".join([".venv/bin/python", "benchmarks/first_step.py", *(argv or sys.argv[1:])])
    text = [
        "## First step (independence check) vs steady step: peak memory "
        "(`benchmarks/first_step.py`)",
        "",
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} by `{cmd}` "
        f"({(time.perf_counter() - t_start) / 60:.1f} min, device `{device}`).",
        "",
        *facts,
        "",
        "Model and batch: benchmarks/step.py's Llama (4 layers, hidden 256, intermediate 688, "
        "vocab 4096, float32), B = 2 random tokens, labels = inputs; dprc = hutch k = 32 "
        "(per-example sketch), book-keeping clipped sums, SGD. A fresh process per cell: "
        "step 1 (the independence check runs inside it, for `dprc`) and then steps 2–3, each "
        "with the high-water mark reset before it. Δ = peak − RSS once model, optimizer, "
        "engine and batch exist. *live*: `MALLOC_MMAP_THRESHOLD_=131072` (the peak follows "
        "the live tensors; the default allocator's peak varies by up to ~15% between "
        "identical processes).",
        "",
        *table,
        "",
        f"**{line}** (target ≤ {TARGET}×)",
        "",
        kept_notes(out),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_page(out, "\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
