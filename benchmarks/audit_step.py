"""Issue 18: a many-trial audit of one engine step — can it catch half the noise?

The one-run audit (benchmarks/audit.py) could not refute an engine with per-example sketches
that adds half the noise it claims. This one audits a single step at sample rate 1 with
side² Dirac canaries on fresh coins per repetition (``dprc_core.auditing.step_trials``): the
side²·repetitions (coin, score) pairs are independent trials of the step, and Clopper–Pearson
counts at thresholds fixed in advance give an ε lower bound at 95 % (Bonferroni over the
thresholds and both directions).

Rows: the real engine and the engine adding σ/2 (and σ/4) while claiming σ, for exact clipping
and hutch k = 32 with per-example sketches; σ from the accountant for one step at q = 1 and the
claimed ε ∈ {1, 3}, δ = 1e-5.

    .venv/bin/python benchmarks/audit_step.py            # docs/benchmarks/audit_step.md
    .venv/bin/python benchmarks/audit_step.py --quick    # one seed, fewer repetitions, prints
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

from benchmarks.kit.engines import CASES as ONE_RUN_CASES  # noqa: E402  (audit.py's engines)
from benchmarks.kit.engines import factory  # noqa: E402
from dprc_core import accounting  # noqa: E402
from dprc_core.auditing.step_trials import run_step_trial_audit  # noqa: E402

DELTA, SIDE = 1e-5, 64
# the one-run audit's exact and per-example rows, and exact clipping with half the noise
CASES = [
    ONE_RUN_CASES[0],
    ("BROKEN: exact, half the noise", "half_noise", "exact"),
    *(case for case in ONE_RUN_CASES if case[2] == "hutch/per_example"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repetitions", type=int, default=200)
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 3.0])
    ap.add_argument("--out", default=str(DOCS / "benchmarks" / "audit_step.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    seeds = [0] if args.quick else [0, 1, 2]
    reps = 20 if args.quick else args.repetitions
    t0 = time.perf_counter()
    rows, violations = [], []
    for eps in args.eps:
        for label, kind, method in CASES:
            clipping, _, sketch = method.partition("/")
            sketch = sketch or "shared"
            k = 32 if clipping != "exact" else None
            sigma = accounting.noise_multiplier(eps, DELTA, 1.0, 1, clipping, k, sketch=sketch)
            accounted = accounting.epsilon(
                sigma, 1.0, 1, DELTA, envelope=clipping, k=k, sketch=sketch
            )
            added = sigma / {"real": 1, "half_noise": 2, "quarter_noise": 4}[kind]
            truth = accounting.epsilon(added, 1.0, 1, DELTA, envelope=clipping, k=k, sketch=sketch)
            bounds, detail = [], []
            for seed in seeds:
                audit = run_step_trial_audit(
                    factory(kind, sigma, method),
                    side=SIDE,
                    repetitions=reps,
                    noise_multiplier=sigma,
                    delta=DELTA,
                    seed=seed,
                )
                b = audit.bound
                bounds.append(b.epsilon_lower)
                detail.append(f"{b.positives[0]}/{b.positives[1]} @ {b.threshold / sigma:g}σ")
                if kind == "real" and b.epsilon_lower > accounted:
                    violations.append((label, eps, seed, b))
            refuted = sum(x > accounted for x in bounds)
            rows.append((label, kind, eps, sigma, accounted, truth, bounds, detail, refuted))
            print(
                f"[{time.perf_counter() - t0:6.1f}s] eps={eps:g} {label}: sigma={sigma:.3f} "
                f"accounted={accounted:.3f} true(added)={truth:.2f} "
                f"LB={[round(x, 3) for x in bounds]} {detail}",
                flush=True,
            )
    wall = time.perf_counter() - t0
    if violations:
        print("PRIVACY VIOLATION: audited lower bound above the accounted epsilon:", violations)
    trials = SIDE * SIDE * reps
    lines = [
        "## Many-trial audit of one step: per-example sketches (issue 18)",
        "",
        f"`benchmarks/audit_step.py` — {platform.machine()}, {os.cpu_count()} CPU cores, torch "
        f"{torch.__version__}, {len(seeds)} seed(s), wall time {wall / 60:.1f} min. "
        "`dprc_core.auditing.run_step_trial_audit`: one engine step at sample rate 1, repeated "
        f"{reps} times; each repetition holds {SIDE}² = {SIDE * SIDE} rank-1 Dirac canaries "
        "(norm 100·C, C = 1) on fresh fair coins and 16 real examples, in micro-batches of 512; "
        f"{trials} independent (coin, score) trials per seed. Bound: Clopper–Pearson at "
        "thresholds 0.5σ … 4σ of the *claimed* σ, both directions, 95 % with Bonferroni over "
        f"the 16 tests; δ = {DELTA:g}. σ is the accountant's for one step at q = 1. *True ε* "
        "is the accountant's ε at the σ the engine really adds (an upper bound on the truth; "
        "the audit can only approach it). `hits`: hits among in / out trials at the best "
        "threshold.",
        "",
        "| mechanism | claimed ε | σ claimed | accounted ε | ε at the σ added | lower bound "
        "per seed | hits (best test) | seeds refuting the claim |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for label, kind, eps, sigma, accounted, truth, bounds, detail, refuted in rows:
        verdict = f"{refuted}/{len(bounds)}" + (" (must be 0)" if kind == "real" else "")
        if kind != "real" and refuted:
            verdict = f"**{verdict}**"
        lines.append(
            f"| {label} | {eps:g} | {sigma:.3f} | {accounted:.3f} | {truth:.2f} | "
            f"{', '.join(f'{x:.2f}' for x in bounds)} | {'; '.join(detail)} | {verdict} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
