"""Issue 18: can the utility benchmark resolve the effect of the sketch? A paired design.

Both tasks of ``benchmarks/utility.py``, ε = 1, learning rate 0.01 for every row (the rate
utility.py's sweep chose for every randomized method; for exact on the classification task too),
seeds 0..S-1:

* ``cls``: MiniLM + LoRA, standard-library docstrings by area (4 classes), N = 1901, 60 steps;
  test accuracy;
* ``lm``: the tiny Llama (local init, full fine-tuning), character LM on 64-character windows,
  38 steps; test loss (nats/char).

Rows:

* ``exact``: DP-SGD with exact norms at its own σ;
* ``exact @ σ(per-example)``: exact norms at the σ that hutch k = 32 with per-example sketches
  needs (the control that separates the σ effect from the estimator's);
* ``hutch32 shared``: one projection per layer per step (revealed-scale σ);
* ``hutch32 per-example``: independent per-example projections (hidden-scale σ).

Common random numbers: the runner draws the Poisson batches, the noise and the projections from
separate streams derived from the seed (dprc_core/seeding.py), and the LoRA/head initialisation
from ``torch.manual_seed(seed)``; so with one seed every row sees the same batches, the same
standard-normal noise draws (scaled by its own σ) and the same initial weights. Differences are
therefore reported per seed (row − exact), as mean ± standard error over seeds.

    .venv/bin/python benchmarks/sketch_utility.py [--task cls lm] [--seeds 10]
    .venv/bin/python benchmarks/sketch_utility.py --report      # the tables from the saved cells

Each cell runs in its own process and is saved as soon as it is done
(docs/benchmarks/sketch_utility.json), so an interrupted run is resumed with the same command
and ``--report`` tabulates whatever has finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

ROOT = Path(__file__).resolve().parents[1]

from dprc_core.training.plan import plan_privacy  # noqa: E402

DOCS = ROOT / "docs"
CELLS = DOCS / "benchmarks" / "sketch_utility.json"
EPS = 1.0
LR = 1e-2
ROWS = [
    ("exact", "exact", "shared", None),
    ("exact @ σ(per-example)", "exact", "shared", "per_example_sigma"),
    ("hutch32 shared", "hutch32", "shared", None),
    ("hutch32 per-example", "hutch32", "per_example", None),
]


def _load() -> dict[str, dict]:
    return json.loads(CELLS.read_text()) if CELLS.exists() else {}


def _save(cells: dict[str, dict]) -> None:
    CELLS.write_text(json.dumps(cells, indent=1, sort_keys=True))


TASKS = ("cls", "lm")


def _key(task: str, label: str, seed: int) -> str:
    # the classification cells were saved first, without a task prefix
    return f"{label}|{seed}" if task == "cls" else f"{task}/{label}|{seed}"


def _parse(key: str) -> tuple[str, str, int]:
    head, seed = key.rsplit("|", 1)
    task, _, label = head.rpartition("/") if head.startswith("lm/") else ("cls", "", head)
    return task, label, int(seed)


def _per_example_sigma(task) -> float:
    return plan_privacy(
        dataset_size=task.sizes["train"],
        batch_size=task.batch_size,
        epochs=task.epochs,
        clipping="hutch",
        k=32,
        target_epsilon=EPS,
        sketch="per_example",
    ).noise_multiplier


def run_cell(key: str, work: Path) -> dict:
    """One cell (see ``_key``), in this process: the row's run and its test metric."""
    from benchmarks import utility as u  #: its data, task and run_dp

    task_name, label, seed = _parse(key)
    _, method, sketch, sigma_of = next(row for row in ROWS if row[0] == label)
    task = u.make_tasks(work, quick=False)[task_name]
    sigma = _per_example_sigma(task) if sigma_of else None
    t0 = time.perf_counter()
    r = u.run_dp(task, method, EPS, LR, int(seed), work, sketch=sketch, sigma=sigma)
    r.update(label=label, sketch=sketch, wall=time.perf_counter() - t0)
    return r


def run(tasks: list[str], n_seeds: int) -> None:
    """Every missing cell, each in a fresh process (nothing of one run can leak into the next;
    a crash loses one cell), saved as soon as it is done."""
    work = Path(tempfile.mkdtemp(prefix="dprc-sketch-utility-"))
    cells = _load()
    order = [(t, s, row[0]) for t in tasks for s in range(n_seeds) for row in ROWS]
    for task, seed, label in order:
        key = _key(task, label, seed)
        if key in cells:
            continue
        out = work / "cell.json"
        cmd = [sys.executable, __file__, "--cell", key, "--work", str(work), "--out", str(out)]
        subprocess.run(cmd, check=True)
        r = json.loads(out.read_text())
        cells[key] = r
        _save(cells)
        print(f"{key}: test {r['test']:.4f} sigma {r['sigma']:.4f} ({r['wall']:.0f} s)")


_TASK_TEXT = {
    "cls": (
        "MiniLM + LoRA, standard-library docstrings by area (4 classes), N = 1901, 60 steps, "
        "δ = 0.00024",
        "test accuracy (%)",
        100.0,
    ),
    "lm": (
        "tiny Llama (local init, full fine-tuning), character LM, 64-character windows, "
        "N = 1200, 38 steps, δ = 0.00041",
        "test loss (nats/char, lower is better)",
        1.0,
    ),
}


def _table(task: str, cells: dict[str, dict]) -> list[str]:
    by = {}
    for key, cell in cells.items():
        t, label, seed = _parse(key)
        if t == task:
            by[(label, seed)] = cell
    seeds = sorted({s for _, s in by})
    if not seeds:
        return []
    text, metric, unit = _TASK_TEXT[task]
    lines = [
        f"### {task}: {text}",
        "",
        f"ε = {EPS:g}, lr = {LR:g}, seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}); {metric}, "
        "mean ± standard error over seeds; the difference to exact is taken per seed.",
        "",
        f"| row | σ | seeds | {metric} | − exact (paired) | − exact @ σ(per-example) (paired) |",
        "|---|---|---|---|---|---|",
    ]
    control = ROWS[1][0]  # exact at the per-example σ: the estimator's effect alone
    for label, *_ in ROWS:
        got = [s for s in seeds if (label, s) in by]
        if not got:
            continue
        val = [unit * by[(label, s)]["test"] for s in got]
        mean = statistics.fmean(val)
        se = statistics.stdev(val) / math.sqrt(len(val)) if len(val) > 1 else float("nan")
        diffs = [
            "—" if label == ref else _paired(by, label, ref, got, unit)
            for ref in ("exact", control)
        ]
        sigma = by[(label, got[0])]["sigma"]
        lines.append(
            f"| {label} | {sigma:.4f} | {len(got)} | {mean:.3f} ± {se:.3f} | {' | '.join(diffs)} |"
        )
    return lines + [""]


def _paired(by: dict, label: str, ref: str, seeds: list[int], unit: float) -> str:
    """Mean ± standard error over seeds of (row − reference), seed by seed."""
    d = [unit * (by[(label, s)]["test"] - by[(ref, s)]["test"]) for s in seeds if (ref, s) in by]
    if len(d) < 2:
        return "—"
    return f"{statistics.fmean(d):+.3f} ± {statistics.stdev(d) / math.sqrt(len(d)):.3f}"


def report() -> str:
    cells = _load()
    lines = [
        "## Per-example sketches: a paired utility comparison (issue 18)",
        "",
        f"`benchmarks/sketch_utility.py` — x86_64, {os.cpu_count()} CPU cores shared with other "
        "work, each cell in its own process. Common random numbers: every row of one seed sees "
        "the same Poisson batches, noise draws and initial weights.",
        "",
    ]
    for task in TASKS:
        lines += _table(task, cells)
    text = "\n".join(lines)
    (DOCS / "benchmarks" / "sketch_utility.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--task", nargs="+", choices=TASKS, default=list(TASKS))
    ap.add_argument("--report", action="store_true", help="only tabulate the saved cells")
    ap.add_argument("--cell", help=argparse.SUPPRESS)  # internal: run one cell (label|seed)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        args.out.write_text(json.dumps(run_cell(args.cell, args.work)))
        return
    if not args.report:
        run(args.task, args.seeds)
    print(report())


if __name__ == "__main__":
    main()
