"""RSS of one process before and after what a 10⁷-example create's accountant does (issue 45,
part 4: the API's memory back within +32 MiB of its start after 10⁷-scale creates).

The plan of ``POST /v1/fine_tuning/jobs`` for N examples, batch 1,024, one epoch, exact
clipping (``service.budget.planning.library_plan``: σ calibrated for the target, ~N/1,024
steps), then the job's budget check alone on its data set (``epsilon_for_history`` of its
event, ``service.budget.budget.compose``), in this process; prints VmRSS
(``/proc/self/status``) above its value after a small create, after each big create: with the
service's releases (``dprc_core.accounting.memory.release_if_big``, the default), without
them (``--no-release``: the code before), or with its parts one at a time (``--parts``).

``PYTHONPATH=$PWD .venv/bin/python benchmarks/create_memory.py [--no-release | --parts]``
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.memory import rss_bytes


def rss_mib() -> float:
    return rss_bytes() / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--target", type=float, default=2.0)
    ap.add_argument(
        "--parts", action="store_true", help="release step by step and report each (diagnosis)"
    )
    ap.add_argument("--no-release", action="store_true", help="the code before: no release")
    args = ap.parse_args()
    if args.no_release or args.parts:  # the service's own releases off
        from dprc_core.accounting import memory

        memory.BIG_TRANSFORM = 1 << 62

    from dprc_core.accounting import memory as accounting_memory
    from dprc_core.accounting.events import SubsampledGaussianEvent
    from dprc_core.noise import Gaussian
    from service.budget.budget import compose
    from service.budget.planning import library_plan

    # a small create first: imports, the accountant's first allocations (a server has made
    # jobs before)
    library_plan(400, 20, 1, "exact", None, 2.0, None, Gaussian(), "shared")
    gc.collect()
    start = rss_mib()
    out: dict = {"start_mib": round(start, 1), "creates": []}
    for n in args.n:
        t = time.perf_counter()
        plan = library_plan(n, args.batch, 1, "exact", None, args.target, None, Gaussian())
        ev = SubsampledGaussianEvent(
            plan.noise_multiplier, plan.sample_rate, plan.steps, "exact", None
        )
        eps = compose([ev], plan.delta)  # the budget check's composition
        row = {
            "n": n,
            "steps": plan.steps,
            "sigma": plan.noise_multiplier,
            "epsilon": eps,
            "seconds": round(time.perf_counter() - t, 2),
            "after_mib": round(rss_mib() - start, 1),
        }
        if args.parts:
            gc.collect()
            row["gc_mib"] = round(rss_mib() - start, 1)
            accounting_memory.clear_fft_plans()
            row["fft_plans_mib"] = round(rss_mib() - start, 1)
            accounting_memory.trim_heap()
            row["malloc_trim_mib"] = round(rss_mib() - start, 1)
        out["creates"].append(row)
    out["end_mib"] = round(rss_mib() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
