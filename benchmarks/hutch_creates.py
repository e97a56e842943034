"""Accountant CPU of a hutch create burst in one process (issue 45 part 3, a profile aid).

30 creates of the budget benchmark (N = 400, batch 20, one epoch, hutch k = 32, the
per-example sketch, targets 2.0 + 0.05·i) after 25 older jobs on the same file: each create's
calibration (``library_plan``) and its leaf of the file's history (``build_leaf``), as the
service runs them, one after the other; prints the CPU time and the number and cost of
hidden-scale step PLDs.

``PYTHONPATH=$PWD .venv/bin/python benchmarks/hutch_creates.py [--profile]``
"""

from __future__ import annotations

import argparse
import time

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.timing import timed
from dprc_core.accounting import hidden_scale_pld
from dprc_core.accounting.events import SubsampledGaussianEvent
from dprc_core.accounting.history import build_leaves, epsilon_for_history
from dprc_core.noise import Gaussian
from service.budget.planning import library_plan

N, BATCH, K = 400, 20, 32


def event(plan) -> SubsampledGaussianEvent:
    return SubsampledGaussianEvent(
        plan.noise_multiplier, plan.sample_rate, plan.steps, "hutch", K, None, "per_example"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--creates", type=int, default=30)
    args = ap.parse_args()
    calls = [0, 0.0]
    orig = hidden_scale_pld.step_pld

    def counted(*a, **kw):
        t = time.process_time()
        try:
            return orig(*a, **kw)
        finally:
            calls[0] += 1
            calls[1] += time.process_time() - t

    hidden_scale_pld.step_pld = counted
    older = []
    for i in range(25):  # the older jobs: their own targets
        plan = library_plan(
            N, BATCH, 1, "hutch", K, 1.0 + 0.01 * i, None, Gaussian(), "per_example"
        )
        older.append(event(plan))
    delta = plan.delta
    epsilon_for_history(older, delta)
    calls[:] = [0, 0.0]
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.process_time()
    cal = leaf = 0.0

    def burst() -> None:
        nonlocal cal, leaf
        for i in range(args.creates):
            t = time.process_time()
            plan = library_plan(
                N, BATCH, 1, "hutch", K, 2.0 + 0.05 * i, None, Gaussian(), "per_example"
            )
            t1 = time.process_time()
            build_leaves([*older, event(plan)], delta)
            t2 = time.process_time()
            cal += t1 - t
            leaf += t2 - t1

    wall, _ = timed(burst)
    total = time.process_time() - t0
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats("cumtime").print_stats(30)
    print(
        f"creates {args.creates}: wall {wall:.2f} s, CPU {total:.2f} s "
        f"(calibration {cal:.2f}, leaves {leaf:.2f}); "
        f"hidden-scale step PLDs {calls[0]} ({calls[1]:.2f} s)"
    )


if __name__ == "__main__":
    main()
