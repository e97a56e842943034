"""Privacy accountant: time of ``epsilon`` and ``noise_multiplier``, and discretisation accuracy.

Setting (issue): q = 1e-3, 10 000 steps, δ = 1e-6; clipping ``exact`` and ``hutch`` with k = 32
(dimension-free envelope). One CPU core: the BLAS/OpenMP thread pools are limited to one thread
before numpy is imported. Targets: calibration (hutch) < 5 s, ``epsilon`` (hutch) < 1 s, and
the upper bound within 1% of a 10× finer discretisation (loss grid and scale bins).

Method (docs/design.md §5): σ is first calibrated to ε = 1; then ``epsilon`` at that σ is timed for
every configuration interleaved A B C … A B C … in one process (``--rounds`` rounds), next to
Google ``dp_accounting``'s PLD for the exact case (pessimistic connect-the-dots,
value_discretization_interval = 1e-4, ``from_gaussian_mechanism`` → ``self_compose`` →
``get_epsilon_for_delta``); medians are reported. ``noise_multiplier`` is timed the same way,
with ``dp_accounting.calibrate_dp_mechanism`` (PLD accountant, 1e-4, tol 0.5% of σ) beside the
exact case.

Usage::

    .venv/bin/python benchmarks/accountant.py              # writes docs/benchmarks/accountant.md
    .venv/bin/python benchmarks/accountant.py --quick      # 1 round, prints only
    .venv/bin/python benchmarks/accountant.py --reproduction  # table of docs/accounting.md
"""

from __future__ import annotations

import os

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT  # noqa: E402
from benchmarks.kit.timing import timed  # noqa: E402

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

import dp_accounting  # noqa: E402
import numpy as np  # noqa: E402
from dp_accounting.pld import privacy_loss_distribution as dpl  # noqa: E402

from dprc_core import accounting  # noqa: E402
from dprc_core.accounting import DEFAULT_SETTINGS, SubsampledGaussianEvent, account  # noqa: E402

Q, STEPS, DELTA, TARGET_EPS = 1e-3, 10_000, 1e-6, 1.0
CONFIGS = [("exact", None), ("hutch", 32)]


def dp_accounting_epsilon(sigma: float) -> float:
    pld = dpl.from_gaussian_mechanism(
        sigma, sampling_prob=Q, value_discretization_interval=1e-4, pessimistic_estimate=True
    )
    return pld.self_compose(STEPS).get_epsilon_for_delta(DELTA)


def dp_accounting_sigma() -> float:
    def event(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)), STEPS
        )

    def fresh() -> dp_accounting.PrivacyAccountant:
        return dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)

    return dp_accounting.calibrate_dp_mechanism(
        fresh,
        event,
        TARGET_EPS,
        DELTA,
        dp_accounting.LowerEndpointAndGuess(0.3, 1.0),
        tol=0.005 * 0.8,
    )


def interleaved(tasks: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in tasks}
    values: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in tasks.items():
            dt, values[name] = timed(fn)
            times[name].append(dt)
    return {name: [statistics.median(t), values[name]] for name, t in times.items()}


def run(rounds: int) -> str:
    sigmas = {c: accounting.noise_multiplier(TARGET_EPS, DELTA, Q, STEPS, c, k) for c, k in CONFIGS}
    eps_tasks: dict[str, Callable[[], float]] = {
        f"dprc {c}" + (f" k={k}" if k else ""): (
            lambda c=c, k=k: accounting.epsilon(sigmas[c], Q, STEPS, DELTA, c, k)
        )
        for c, k in CONFIGS
    }
    eps_tasks["dp_accounting exact (1e-4)"] = lambda: dp_accounting_epsilon(sigmas["exact"])
    cal_tasks: dict[str, Callable[[], float]] = {
        f"dprc {c}" + (f" k={k}" if k else ""): (
            lambda c=c, k=k: accounting.noise_multiplier(TARGET_EPS, DELTA, Q, STEPS, c, k)
        )
        for c, k in CONFIGS
    }
    cal_tasks["dp_accounting exact (1e-4)"] = dp_accounting_sigma
    eps_res = interleaved(eps_tasks, rounds)
    cal_res = interleaved(cal_tasks, max(1, rounds // 2))

    lines = [
        "## Privacy accountant (q = 1e-3, 10 000 steps, δ = 1e-6, one CPU core)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, numpy {np.__version__}, dp_accounting "
        f"{getattr(dp_accounting, '__version__', '0.6')}; thread pools limited to 1. "
        f"{datetime.now(UTC):%Y-%m-%d}. Medians of {rounds} interleaved rounds (calibration: "
        f"{max(1, rounds // 2)}). σ calibrated to ε = {TARGET_EPS}, δ = {DELTA:g}; "
        "dimension-free envelope for hutch.",
        "",
        "| task | accountant | σ | ε | median time (s) | target |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, (t, value) in eps_res.items():
        key = "exact" if "exact" in name else "hutch"
        target = "< 1 s" if name.startswith("dprc hutch") else ""
        lines.append(f"| epsilon | {name} | {sigmas[key]:.5f} | {value:.5f} | {t:.3f} | {target} |")
    for name, (t, value) in cal_res.items():
        key = "exact" if "exact" in name else "hutch"
        eps_at = (
            accounting.epsilon(value, Q, STEPS, DELTA, key, 32 if key == "hutch" else None)
            if name.startswith("dprc")
            else dp_accounting_epsilon(value)
        )
        target = "< 5 s" if name.startswith("dprc hutch") else ""
        lines.append(
            f"| noise_multiplier (ε ≤ {TARGET_EPS}) | {name} | {value:.5f} | {eps_at:.5f} | "
            f"{t:.3f} | {target} |"
        )
    lines += [
        "",
        "Accuracy: ε of the default discretisation against a 10× finer one (loss-grid "
        "interval and scale-bin width both divided by 10), same σ:",
        "",
        "| clipping | σ | ε default | ε 10× finer | difference | grid h | scale bins |"
        " time default (s) | time finer (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, k in CONFIGS:
        event = SubsampledGaussianEvent(sigmas[c], Q, STEPS, c, k)
        t1, res = timed(lambda event=event: account([event], DELTA))
        t2, fine = timed(lambda event=event: account([event], DELTA, DEFAULT_SETTINGS.finer(10)))
        diff = res.epsilon / fine.epsilon - 1.0
        lines.append(
            f"| {c}{f' k={k}' if k else ''} | {sigmas[c]:.5f} | {res.epsilon:.5f} | "
            f"{fine.epsilon:.5f} | {diff:+.3%} | {res.grid_interval:.3g} | "
            f"{res.scale_bins[0]} | {t1:.2f} | {t2:.2f} |"
        )
    return "\n".join(lines) + "\n"


# --- reproduction of the paper's noise multipliers (docs/accounting.md) ---------------------

PAPER_T6 = {8: 3.1563, 32: 1.821, 64: 1.774, 512: 1.7568}  # ε = 2, δ = 1e-5 (Table 6)
PAPER_T4 = {"dp-sgd": 4.073, 32: 4.354}  # ε = 0.7, δ = 1e-5 (Table 4)


def reproduction(epochs: int = 3) -> str:
    """σ_RC/σ_DP-SGD (and σ) for a BBC-like job, next to the paper's Tables 4 and 6."""
    n, b = 1800, 32
    q, steps = b / n, epochs * -(-n // b)
    ks = (8, 32, 64, 512)
    lines = [
        f"BBC-like job: N = {n}, B = {b} (q = {q:.5f}), {epochs} epochs = {steps} steps, "
        "δ = 1e-5, Hutch with the dimension-free envelope. Cells: σ_RC (σ_RC/σ_DP-SGD).",
        "",
        "| ε | σ DP-SGD | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---:|---:|" + "---:|" * len(ks),
    ]
    for eps in (0.7, 2.0, 9.0):
        base = accounting.noise_multiplier(eps, 1e-5, q, steps)
        cells = []
        for k in ks:
            sig = accounting.noise_multiplier(eps, 1e-5, q, steps, "hutch", k)
            cells.append(f"{sig:.4f} ({sig / base:.3f})")
        lines.append(f"| {eps:g} | {base:.4f} | " + " | ".join(cells) + " |")
    paper = [f"{PAPER_T6[k]:.4f} ({PAPER_T6[k] / PAPER_T6[512]:.3f}†)" for k in ks]
    lines.append("| 2 (paper T6) | – | " + " | ".join(paper) + " |")
    lines.append(
        f"| 0.7 (paper T4) | {PAPER_T4['dp-sgd']:.4f} | – | {PAPER_T4[32]:.4f} "
        f"({PAPER_T4[32] / PAPER_T4['dp-sgd']:.3f}) | – | – |"
    )
    lines += ["", "† the paper gives no DP-SGD σ at ε = 2; its ratios are to its k = 512 σ."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 round, print only")
    parser.add_argument("--reproduction", action="store_true")
    parser.add_argument("--epochs", type=int, default=3, help="epochs for --reproduction")
    args = parser.parse_args()
    if args.reproduction:
        print(reproduction(args.epochs))
        return
    table = run(1 if args.quick else args.rounds)
    print(table)
    if not args.quick:
        out = ROOT / "docs" / "benchmarks" / "accountant.md"
        out.write_text(table)
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
