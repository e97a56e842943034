"""Issue 18: can the utility benchmark resolve the effect of the sketch? A paired design.

The classification task of ``benchmarks/utility.py`` (MiniLM + LoRA, standard-library
docstrings by area, N = 1901, 60 steps), ε = 1, learning rate 0.01 (the rate utility.py's sweep
chose for every method), seeds 0..S-1. Rows:

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

    .venv/bin/python benchmarks/sketch_utility.py [--seeds 10]  # docs/benchmarks_sketch_utility.md
    .venv/bin/python benchmarks/sketch_utility.py --report      # the table from the saved cells

Cells are saved one by one (docs/benchmarks_sketch_utility.json), so an interrupted run is
resumed with the same command and ``--report`` tabulates whatever has finished.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dprc_core.training.plan import plan_privacy  # noqa: E402

DOCS = ROOT / "docs"
CELLS = DOCS / "benchmarks_sketch_utility.json"
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
    """One cell (``label|seed``), in this process: the row's run and its test accuracy."""
    import utility as u  # benchmarks/utility.py: its data, task and run_dp

    label, seed = key.rsplit("|", 1)
    _, method, sketch, sigma_of = next(row for row in ROWS if row[0] == label)
    task = u.make_tasks(work, quick=False)["cls"]
    sigma = _per_example_sigma(task) if sigma_of else None
    t0 = time.perf_counter()
    r = u.run_dp(task, method, EPS, LR, int(seed), work, sketch=sketch, sigma=sigma)
    r.update(label=label, sketch=sketch, wall=time.perf_counter() - t0)
    return r


def run(n_seeds: int) -> None:
    """Every missing cell, each in a fresh process (nothing of one run can leak into the next;
    a crash loses one cell), saved as soon as it is done."""
    work = Path(tempfile.mkdtemp(prefix="dprc-sketch-utility-"))
    cells = _load()
    for seed in range(n_seeds):
        for label, *_ in ROWS:
            key = f"{label}|{seed}"
            if key in cells:
                continue
            out = work / "cell.json"
            cmd = [sys.executable, __file__, "--cell", key, "--work", str(work), "--out", str(out)]
            subprocess.run(cmd, check=True)
            r = json.loads(out.read_text())
            cells[key] = r
            _save(cells)
            print(f"{key}: test {r['test']:.4f} sigma {r['sigma']:.4f} ({r['wall']:.0f} s)")


def report() -> str:
    cells = _load()
    seeds = sorted({int(k.split("|")[1]) for k in cells})
    by = {(c["label"], int(k.split("|")[1])): c for k, c in cells.items()}
    lines = [
        "## Per-example sketches: a paired utility comparison (issue 18)",
        "",
        f"`benchmarks/sketch_utility.py` — x86_64, {os.cpu_count()} CPU cores shared with other "
        f"work. MiniLM + LoRA, standard-library docstrings by area (4 classes), N = 1901, 60 "
        f"steps, ε = {EPS:g}, δ = 0.00024, lr = {LR:g}, seeds {seeds[0] if seeds else '-'}"
        f"–{seeds[-1] if seeds else '-'} ({len(seeds)}). Common random numbers: every row of "
        "one seed sees the same Poisson batches, noise draws and initial weights. Test accuracy "
        "(%), mean ± standard error over seeds; the difference to exact is taken per seed.",
        "",
        "| row | σ | seeds | test accuracy | − exact (paired) |",
        "|---|---|---|---|---|",
    ]
    for label, *_ in ROWS:
        got = [s for s in seeds if (label, s) in by]
        if not got:
            continue
        acc = [100 * by[(label, s)]["test"] for s in got]
        mean = statistics.fmean(acc)
        se = statistics.stdev(acc) / math.sqrt(len(acc)) if len(acc) > 1 else float("nan")
        paired = [
            100 * (by[(label, s)]["test"] - by[("exact", s)]["test"])
            for s in got
            if ("exact", s) in by
        ]
        if label == "exact" or len(paired) < 2:
            diff = "—"
        else:
            d = statistics.fmean(paired)
            diff = f"{d:+.2f} ± {statistics.stdev(paired) / math.sqrt(len(paired)):.2f}"
        sigma = by[(label, got[0])]["sigma"]
        lines.append(f"| {label} | {sigma:.4f} | {len(got)} | {mean:.2f} ± {se:.2f} | {diff} |")
    text = "\n".join(lines) + "\n"
    (DOCS / "benchmarks_sketch_utility.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--report", action="store_true", help="only tabulate the saved cells")
    ap.add_argument("--cell", help=argparse.SUPPRESS)  # internal: run one cell (label|seed)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        args.out.write_text(json.dumps(run_cell(args.cell, args.work)))
        return
    if not args.report:
        run(args.seeds)
    print(report())


if __name__ == "__main__":
    main()
