"""Noise multipliers of shared against per-example sketches (issue 18, the accountant half).

For the utility benchmark's plans (benchmarks/utility.py: classification N = 1901, expected
batch 64, 2 epochs; LM N = 1200, batch 64, 2 epochs; q = B/N, steps = ⌈E·N/B⌉, δ the planner's
default 1/N^1.1 rounded down) and ε ∈ {1, 3, 8}: σ calibrated by
:func:`dprc_core.accounting.noise_multiplier` (the planner's relative tolerance 0.5%) for exact
DP-SGD, Hutchinson with a shared sketch (revealed-scale model) and with per-example sketches
(hidden-scale model, docs/accounting.md §10), k ∈ {16, 32, 64}, dimension-free envelope (the
planner's default; Hutch++ has the same σ as Hutch at equal k under it). Reported: σ, its
overhead over exact, and the wall time of each calibration (one thread, each calibration run
once in a fresh cache state; ``--rounds`` repeats the whole grid and reports the median).

Usage::

    .venv/bin/python benchmarks/sketch_sigma.py            # writes docs/benchmarks/sketch_sigma.md
    .venv/bin/python benchmarks/sketch_sigma.py --quick    # classification plan only, prints
"""

from __future__ import annotations

import os

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT  # noqa: E402

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from dprc_core import accounting  # noqa: E402
from dprc_core.accounting.steps import planned_steps  # noqa: E402
from dprc_core.training.plan import default_delta  # noqa: E402

# (name, N, expected batch, epochs): the utility benchmark's two tasks (train split sizes)
PLANS = [("classification (MiniLM)", 1901, 64, 2.0), ("causal LM (tiny Llama)", 1200, 64, 2.0)]
EPSILONS = [1.0, 3.0, 8.0]
KS = [16, 32, 64]
SKETCHES = ["shared", "per_example"]


def configs() -> list[tuple[str, str | None, int | None, str]]:
    """(label, clipping, k, sketch) in table order."""
    out: list[tuple[str, str | None, int | None, str]] = [("exact", "exact", None, "shared")]
    for sketch in SKETCHES:
        for k in KS:
            out.append((f"hutch k={k}, {sketch.replace('_', '-')} sketch", "hutch", k, sketch))
    return out


def calibrate(eps: float, delta: float, q: float, steps: int, clipping, k, sketch):
    start = time.perf_counter()
    sigma = accounting.noise_multiplier(eps, delta, q, steps, clipping, k, sketch=sketch)
    return sigma, time.perf_counter() - start


def run(plans, rounds: int) -> str:
    lines = [
        "## Noise multiplier: shared vs per-example sketches (issue 18)",
        "",
        f"`benchmarks/sketch_sigma.py` — {platform.machine()}, Python "
        f"{platform.python_version()}, one thread, {datetime.now(UTC):%Y-%m-%d}. σ from "
        "`accounting.noise_multiplier` (relative tolerance 0.5%, the planner's), "
        "dimension-free envelope; *shared*: one projection per layer per step for the batch, "
        "revealed-scale model; *per-example*: an independent projection per example, layer "
        "and step, hidden-scale model (docs/accounting.md §10). Overhead: σ / σ_exact − 1. "
        f"Time: wall seconds of one calibration (median of {rounds} round(s)).",
        "",
    ]
    all_times: list[float] = []
    for name, n, batch, epochs in plans:
        q = batch / n
        steps = planned_steps(n, batch, epochs)
        delta = default_delta(n)
        rows: dict[str, dict[float, tuple[float, list[float]]]] = {}
        for _ in range(rounds):
            for label, clipping, k, sketch in configs():
                for eps in EPSILONS:
                    sigma, secs = calibrate(eps, delta, q, steps, clipping, k, sketch)
                    prev = rows.setdefault(label, {}).get(eps)
                    rows[label][eps] = (sigma, (prev[1] if prev else []) + [secs])
        lines += [
            f"### {name}: N = {n}, q = {q:.4f}, {steps} steps, δ = {delta:.2g}",
            "",
            "| clipping | " + " | ".join(f"σ at ε={e:g} (overhead)" for e in EPSILONS) + " | "
            "calibration s (ε=1, 3, 8) |",
            "|---|" + "---:|" * (len(EPSILONS) + 1),
        ]
        exact = rows["exact"]
        for label, *_ in configs():
            cells = []
            for eps in EPSILONS:
                sigma = rows[label][eps][0]
                over = sigma / exact[eps][0] - 1.0
                cells.append(f"{sigma:.4f}" + ("" if label == "exact" else f" ({over:+.1%})"))
            times = [statistics.median(rows[label][eps][1]) for eps in EPSILONS]
            all_times += times
            lines.append(
                f"| {label} | "
                + " | ".join(cells)
                + " | "
                + ", ".join(f"{t:.2f}" for t in times)
                + " |"
            )
        lines.append("")
    lines.append(
        f"Calibration time over the grid: median {statistics.median(all_times):.2f} s, "
        f"max {max(all_times):.2f} s per point."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="classification plan, print only")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    plans = PLANS[:1] if args.quick else PLANS
    table = run(plans, args.rounds)
    print(table)
    if not args.quick:
        out = ROOT / "docs" / "benchmarks" / "sketch_sigma.md"
        existing = out.read_text() if out.exists() else ""
        marker = "### Reading"
        reading = existing[existing.index(marker) :] if marker in existing else ""
        out.write_text(table + ("\n" + reading if reading else ""))
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
