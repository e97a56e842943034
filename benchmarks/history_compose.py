"""Issue 16 item 2: one budget check of a data set's history, full against incremental.

A file with ``--older`` ended jobs (exact clipping, q = 0.05, σ calibrated for ε = 0.05 +
0.001·i, i % 20 + 1 steps each: the contention benchmark's history) receives 30 jobs one by
one (σ for ε = 2 + 0.05·i, 20 steps). For each new job the budget check composes the whole
history: ``epsilon_for_events`` (a full composition: grid and tail budget from all events) and
``epsilon_for_history`` (dprc_core/accounting/history.py: fixed per-history grid, cached leaves
and power-of-two blocks). Reported: the first check (cold caches), the median of the next 29,
and the largest relative difference between the two ε's (both are upper bounds).

    .venv/bin/python benchmarks/history_compose.py     # -> docs/benchmarks/history.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT  # noqa: E402
from dprc_core.accounting import SubsampledGaussianEvent, epsilon_for_events, noise_multiplier  # noqa: E402
from dprc_core.accounting.history import clear_cache, epsilon_for_history  # noqa: E402

DELTA, Q = 2.5e-4, 0.05


def run(older: int) -> dict:
    history = [
        SubsampledGaussianEvent(noise_multiplier(0.05 + 0.001 * i, DELTA, Q, 20), Q, i % 20 + 1)
        for i in range(older)
    ]
    sigmas = [noise_multiplier(2 + 0.05 * i, DELTA, Q, 20) for i in range(30)]
    new = [SubsampledGaussianEvent(sigma, Q, 20) for sigma in sigmas]
    clear_cache()
    epsilon_for_history(history, DELTA)  # the file as the server has seen it so far
    full_t, inc_t, worst = [], [], 0.0
    for i in range(len(new)):
        events = history + new[: i + 1]
        t0 = time.perf_counter()
        full = epsilon_for_events(events, DELTA)
        t1 = time.perf_counter()
        inc = epsilon_for_history(events, DELTA)
        t2 = time.perf_counter()
        full_t.append(t1 - t0)
        inc_t.append(t2 - t1)
        worst = max(worst, abs(inc - full) / full)
    return {
        "older": older,
        "full_first": full_t[0],
        "full_median": statistics.median(full_t[1:]),
        "inc_first": inc_t[0],
        "inc_median": statistics.median(inc_t[1:]),
        "worst_rel": worst,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--older", type=int, nargs="+", default=[0, 20, 100])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "history.md")
    args = ap.parse_args()
    rows = [run(n) for n in args.older]
    lines = [
        "## A data set's budget check: full against incremental composition (issue 16)",
        "",
        f"`benchmarks/history_compose.py` — {os.cpu_count()} CPU cores (shared). A file with "
        "the given number of ended jobs receives 30 new jobs one by one; each check composes "
        "the whole history (exact clipping, q = 0.05, δ = 2.5e-4).",
        "",
        "| older jobs | full: first (s) | full: median (s) | incremental: first (s) "
        "| incremental: median (s) | largest relative ε difference |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['older']} | {r['full_first']:.3f} | {r['full_median']:.3f} | "
            f"{r['inc_first']:.3f} | {r['inc_median']:.3f} | {r['worst_rel']:.1e} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
