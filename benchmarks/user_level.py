"""Issue 31: user-level DP-SGD(-RC) against example-level DP-SGD converted by group privacy.

The data: the character-LM text of ``benchmarks/utility.py`` (the English prose of CPython's
``pydoc_data/topics.py``: paragraphs of ≥ 15 words found under one topic only, all topics,
64-character windows in text order), split among synthetic **users** with a skewed number of
lines: the r-th largest of the U = 1000 training users holds max(1, ⌊200/r⌋) lines (a Zipf
rank-size law: 200, 100, 66, 50, …, the 100 largest hold two or more lines, 900 hold one;
N = 1898 lines, the largest user exactly k = 200). A user's lines are consecutive windows of
the text, so a user writes about one or a few topics (its "style"). The held-out users follow
the same law at half the scale (500 users, max(1, ⌊100/r⌋) lines: a random half of a Zipf
population); the test metric is the loss per character on all their lines (nats, the mean
over lines, ``runner.evaluate``). Users are placed along the text in a seeded random order,
the unused windows spread between them.

The model: the tiny Llama of utility.py (hidden 64, 2 layers, character tokenizer), locally
initialised with the run's seed (no pretrained causal LM ships offline), fully fine-tuned
with Adam, lr 0.01 for every row (the paired sketch benchmark's rate), C = 1, 40 steps.

Rows, at ε ∈ {1, 3, 8} **per user**, δ = 1/U^1.1 rounded down (the planner's default for
user level, 0.0005 < 1/U):

* ``user exact m=8``: ``privacy_unit: user``, exact norms, the default
  ``max_examples_per_user`` m = 8; expected batch 64 users (q = 0.064), 2.56 epochs of users;
* ``user hutch32 m=8``: the same with DP-SGD-RC (Hutchinson k = 32, per-example sketches,
  keyed by the user; hidden-scale σ);
* ``user exact m=2`` and ``user exact m=32``: other m, the same users sampled every step;
* ``example exact, group k=200``: example-level DP-SGD (exact) at the per-example
  (ε/k, δ_ex) that group privacy over the largest user (k = 200 lines) turns into the per-user
  (ε, δ) (:func:`group_privacy_example_budget`); the expected batch is the expected number of
  *lines* of a ``user exact m=8`` step (64 × 1.342 = 85.9), over the same 40 steps;
* ``non-private``: utility.py's plain torch loop (no clipping, no noise) with the example
  row's Poisson batches of lines and steps; and ``initial model``: no training.

Every DP row is a ``dprc train`` job spec run by ``run_job`` (what ``dprc train job.yaml``
runs). Common random numbers: with one seed every row starts from the same initial weights,
and every DP row adds the same standard-normal noise draws (scaled by its own σ); the user
rows also sample the same users at every step (the line choice within a user depends on m).
Differences are reported per seed (row − ``user exact m=8``; row − ``initial model``), as mean
± standard error over seeds.

    .venv/bin/python benchmarks/user_level.py [--seeds 5] [--rows LABEL ...]
    .venv/bin/python benchmarks/user_level.py --report      # the tables from the saved cells

Each cell runs in its own process and is saved as soon as it is done
(docs/benchmarks/user_level.json), so an interrupted run is resumed with the same command
and ``--report`` tabulates whatever has finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.kit.group_privacy import group_privacy_example_budget, user_sizes  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks"
CELLS = DOCS / "user_level.json"
DOC = DOCS / "user_level.md"
READING = "<!-- reading: hand-written, kept by --report -->"

EPSILONS = (1.0, 3.0, 8.0)
LARGEST = 200  # lines of the largest training user: k of group privacy
USERS = 1000  # training users
TEST_LARGEST, TEST_USERS = 100, 500  # held-out users: the same law at half the scale
WIDTH = 64  # characters a line
USER_BATCH = 64  # expected users a step
STEPS = 40  # every trained row
LR = 1e-2
PLACEMENT_SEED = 31
# one torch thread a cell: on 2 cores shared with other work, two threads made a step 5-10x
# slower than one (they wait for each other whenever the other work takes a core)
THREADS = 1


@dataclass(frozen=True)
class Row:
    label: str
    unit: str  # user | example | nonprivate | init
    norm: str = "exact"  # the job's norm_method
    m: int | None = None  # max_examples_per_user


ROWS = (
    Row("user exact m=8", "user", "exact", 8),
    Row("user hutch32 m=8", "user", "hutch", 8),
    Row("user exact m=2", "user", "exact", 2),
    Row("user exact m=32", "user", "exact", 32),
    Row(f"example exact, group k={LARGEST}", "example", "exact"),
)
REFERENCES = (Row("non-private", "nonprivate"), Row("initial model", "init"))
BY_LABEL = {r.label: r for r in ROWS + REFERENCES}
BASE = ROWS[0].label  # the paired differences are to this row


# --------------------------------------------------------------------------- data
def _windows() -> list[str]:
    """utility.py's LM text, every topic (sorted by name), in order: 64-character windows that
    never straddle two topics."""
    from benchmarks import utility as u

    out: list[str] = []
    for _, paras in sorted(u._paragraphs().items()):
        text = " ".join(" ".join(p.split()) for p in paras)
        text = "".join(c for c in text if c.isascii() and c.isprintable())
        out += [text[i : i + WIDTH] for i in range(0, len(text) - WIDTH + 1, WIDTH)]
    return out


def _lines_per_step(sizes: list[int], m: int | None) -> float:
    """The expected lines of a user-level step: USER_BATCH × mean of min(n, m)."""
    cap = m if m is not None else max(sizes)
    return USER_BATCH * sum(min(n, cap) for n in sizes) / len(sizes)


def _epochs_for(n: int, batch: float, steps: int) -> float:
    """Epochs (as written, a short decimal) whose planned steps are exactly ``steps``."""
    from dprc_core.accounting.steps import planned_steps

    epochs = float(f"{steps * batch / n:.9g}")
    while planned_steps(n, batch, epochs) > steps:
        epochs = float(f"{epochs - 1e-9:.9g}")
    while planned_steps(n, batch, epochs) < steps:
        epochs = float(f"{epochs + 1e-9:.9g}")
    return epochs


def make_data(work: Path) -> dict[str, Any]:
    """The training and held-out JSONL files (written once into ``work``) and their figures."""
    meta_path = work / "data.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    windows = _windows()
    train_sizes, test_sizes = user_sizes(USERS, LARGEST), user_sizes(TEST_USERS, TEST_LARGEST)
    people = [("u", j, n) for j, n in enumerate(train_sizes)]
    people += [("t", j, n) for j, n in enumerate(test_sizes)]
    rng = random.Random(PLACEMENT_SEED)
    rng.shuffle(people)
    spare = len(windows) - sum(n for *_, n in people)
    if spare < 0:
        raise RuntimeError(f"the text holds {len(windows)} windows, the users need more")
    gap_after = set(rng.sample(range(len(people)), min(spare, len(people))))
    rows: dict[str, list[dict[str, str]]] = {"u": [], "t": []}
    pos = 0
    for i, (split, j, n) in enumerate(people):
        rows[split] += [{"text": w, "user_id": f"{split}{j:04d}"} for w in windows[pos : pos + n]]
        pos += n + (i in gap_after)
    paths = {"train": work / "train.jsonl", "test": work / "test.jsonl"}
    for name, split in (("train", "u"), ("test", "t")):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows[split]))
    # the unigram character model of the training lines (add-one): a trivial baseline, per
    # next-character target and averaged per line like evaluate()
    count = Counter("".join(r["text"] for r in rows["u"]))
    total = sum(count.values()) + 100
    unigram = statistics.fmean(
        statistics.fmean(-math.log((count[c] + 1) / total) for c in r["text"][1:])
        for r in rows["t"]
    )
    n = len(rows["u"])
    example_batch = _lines_per_step(train_sizes, 8)
    top10 = sum(sorted(train_sizes, reverse=True)[:10])
    meta = {
        "train": str(paths["train"]),
        "test": str(paths["test"]),
        "windows": len(windows),
        "lines": n,
        "users": USERS,
        "largest": max(train_sizes),
        "median_lines": statistics.median(train_sizes),
        "users_one_line": sum(s == 1 for s in train_sizes),
        "top10_share": top10 / n,
        "test_lines": len(rows["t"]),
        "test_users": TEST_USERS,
        "unigram": unigram,
        "lines_per_step": {str(m): _lines_per_step(train_sizes, m) for m in (2, 8, 32)},
        "example_batch": example_batch,
        "example_epochs": _epochs_for(n, example_batch, STEPS),
        "user_epochs": _epochs_for(USERS, USER_BATCH, STEPS),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def tiny_llama(work: Path, seed: int) -> Path:
    from dprc_core.training.tiny import build_tiny_llama

    return build_tiny_llama(
        work / f"tiny-llama-{seed}", hidden=64, layers=2, max_positions=128, seed=seed
    )


# --------------------------------------------------------------------------- one cell
def _key(label: str, eps: float | None, seed: int) -> str:
    return f"{label}|{'-' if eps is None else f'{eps:g}'}|{seed}"


def _parse(key: str) -> tuple[str, float | None, int]:
    label, eps, seed = key.split("|")
    return label, None if eps == "-" else float(eps), int(seed)


def _user_delta() -> float:
    from dprc_core.training.plan import default_delta

    return default_delta(USERS)


def job_fields(row: Row, eps: float, seed: int, data: dict, model: Path, out: Path) -> dict:
    """The ``dprc train`` spec of a DP row (a YAML mapping of these fields runs the same)."""
    fields: dict[str, Any] = {
        "model": str(model),
        "task": "causal_lm",
        "train_file": data["train"],
        "output_dir": str(out),
        "token_store": str(out.parent.parent / "tokens"),
        "max_seq_len": WIDTH,
        "learning_rate": LR,
        "optimizer": "adam",
        "max_grad_norm": 1.0,
        "norm_method": row.norm,
        "k": 32,
        "seed": seed,
        "max_physical_batch_size": 64,
        "device": "cpu",
        "epsilon_every": 10_000,
    }
    if row.norm == "hutch":
        fields["sketch"] = "per_example"
    if row.unit == "user":
        return {
            **fields,
            "privacy_unit": "user",
            "max_examples_per_user": row.m,
            "batch_size": USER_BATCH,
            "epochs": data["user_epochs"],
            "target_epsilon": eps,  # δ: the planner's default, 1/U^1.1
        }
    eps_ex, delta_ex = group_privacy_example_budget(eps, _user_delta(), LARGEST)
    return {
        **fields,
        "batch_size": data["example_batch"],
        "epochs": data["example_epochs"],
        "target_epsilon": eps_ex,
        "target_delta": delta_ex,
    }


def _test_loss(model: Any, data: dict, tokenizer_dir: Path) -> float:
    from dprc_core.training.data import load_jsonl, tokenize
    from dprc_core.training.models import load_tokenizer
    from dprc_core.training.runner import evaluate

    test = tokenize(load_jsonl(data["test"], "causal_lm"), load_tokenizer(tokenizer_dir), WIDTH)
    return evaluate(model, test, "causal_lm")


def run_cell(key: str, work: Path) -> dict[str, Any]:
    """One cell (label|ε|seed), in this process: the row's run and its test loss."""
    import torch

    from dprc_core.training.models import load_model

    torch.set_num_threads(THREADS)
    label, eps, seed = _parse(key)
    row = BY_LABEL[label]
    data = make_data(work)
    model_dir = tiny_llama(work, seed)
    t0 = time.perf_counter()
    if row.unit == "init":
        test = _test_loss(load_model(model_dir, "causal_lm"), data, model_dir)
        return {"label": label, "seed": seed, "test": test, "sigma": None, "wall": 0.0}
    if row.unit == "nonprivate":
        from benchmarks import utility as u

        task = u.Task(
            "lm",
            "causal_lm",
            str(model_dir),
            None,
            WIDTH,
            data["example_batch"],
            data["example_epochs"],
            [LR],
            Path(data["train"]),
            Path(data["test"]),
            Path(data["test"]),
            None,
            {"train": data["lines"], "test": data["test_lines"]},
            data["unigram"],
        )
        r = u.run_nonprivate(task, LR, seed, steps=STEPS)
        return {
            "label": label,
            "seed": seed,
            "test": r["test"],
            "sigma": 0.0,
            "steps": r["steps"],
            "sample_rate": r["sample_rate"],
            "sec_per_step": r["sec_per_step"],
            "wall": time.perf_counter() - t0,
        }
    assert eps is not None
    from dprc_core.training.learnability import LearnabilityWarning
    from dprc_core.training.runner import JobSpec, Progress, run_job

    out = work / "runs" / key.replace("|", "_").replace(" ", "_").replace(",", "")
    shutil.rmtree(out, ignore_errors=True)
    spec = JobSpec.from_dict(job_fields(row, eps, seed, data, model_dir, out))
    stamps: list[float] = []
    batches: list[int] = []
    events: list[str] = []

    def on_progress(p: Progress) -> None:
        stamps.append(time.perf_counter())
        batches.append(p.batch_size)

    torch.manual_seed(seed)
    with warnings.catch_warnings():  # the learnability verdict is kept as an event
        warnings.simplefilter("ignore", LearnabilityWarning)
        result = run_job(spec, on_progress=on_progress, resume=False, on_event=events.append)
    model = load_model(Path(result.checkpoint) / "model", "causal_lm")
    test = _test_loss(model, data, model_dir)
    shutil.rmtree(out, ignore_errors=True)
    gaps = [b - a for a, b in zip(stamps[:-2], stamps[1:-1], strict=False)]
    plan = result.plan
    return {
        "label": label,
        "eps": eps,
        "seed": seed,
        "test": test,
        "sigma": plan.noise_multiplier,
        "epsilon": result.epsilon,
        "delta": result.delta,
        "unit": plan.unit,
        "units": plan.dataset_size,
        "target_epsilon": plan.target_epsilon,
        "steps": plan.steps,
        "sample_rate": plan.sample_rate,
        "batch_mean": statistics.fmean(batches) if batches else float("nan"),
        "learnability_warning": any(e.startswith("Warning: ") for e in events),
        "sec_per_step": statistics.median(gaps) if gaps else float("nan"),
        "wall": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- the run
def _load() -> dict[str, Any]:
    return json.loads(CELLS.read_text()) if CELLS.exists() else {}


def _save(cells: dict[str, Any]) -> None:
    CELLS.write_text(json.dumps(cells, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def run(n_seeds: int, labels: list[str]) -> None:
    """Every missing cell, each in a fresh process, saved as soon as it is done; the seeds
    outermost, so an interrupted run has whole seeds."""
    work = Path(tempfile.mkdtemp(prefix="dprc-user-level-"))
    cells = _load()
    meta = make_data(work)
    cells["_meta"] = {
        **{k: v for k, v in meta.items() if k not in ("train", "test")},
        "machine": f"{os.cpu_count()} CPU cores shared with other work, {platform.machine()}, "
        f"{THREADS} torch thread a cell",
        "command": "python benchmarks/user_level.py " + " ".join(sys.argv[1:]),
    }
    _save(cells)
    order: list[tuple[str, float | None, int]] = []
    for seed in range(n_seeds):
        order += [(r.label, None, seed) for r in REFERENCES if r.label in labels]
        order += [(r.label, e, seed) for e in EPSILONS for r in ROWS if r.label in labels]
    for label, eps, seed in order:
        key = _key(label, eps, seed)
        if key in cells:
            continue
        out = work / "cell.json"
        cmd = [sys.executable, __file__, "--cell", key, "--work", str(work), "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
        subprocess.run(cmd, check=True, env=env)
        r = json.loads(out.read_text())
        cells[key] = r
        _save(cells)
        sigma = "-" if r["sigma"] is None else f"{r['sigma']:.4g}"
        print(f"{key}: test {r['test']:.4f} sigma {sigma} ({r['wall']:.0f} s)", flush=True)
    shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- the report
def _mean_se(xs: list[float]) -> str:
    if not xs:
        return "—"
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return f"{statistics.fmean(xs):.3f} ± {se:.3f}"


def _paired(a: dict[int, float], b: dict[int, float]) -> str:
    """Mean ± standard error over the seeds both have of (a − b), seed by seed."""
    d = [a[s] - b[s] for s in sorted(a) if s in b]
    if len(d) < 2:
        return "—"
    return f"{statistics.fmean(d):+.3f} ± {statistics.stdev(d) / math.sqrt(len(d)):.3f}"


def _sigmas(sigmas: list[float | None]) -> str:
    """σ of a row's cells: one value, or the range where the seeds' σ differ (the
    calibration of the code each cell ran with)."""
    if sigmas[0] is None:
        return "—"
    lo, hi = min(s for s in sigmas if s is not None), max(s for s in sigmas if s is not None)
    return f"{lo:.3f}" if f"{lo:.4f}" == f"{hi:.4f}" else f"{lo:.4f}–{hi:.4f}"


def _conversion_table(meta: dict[str, Any], got: dict) -> list[str]:
    """ε_user, δ_user → (ε_ex, δ_ex); σ of the example-level and user-level exact rows as the
    run's cells planned them; σ_ex under the simplified lemma's δ_ex, planned here (the
    accountant of the code that runs ``--report``)."""
    from dprc_core.training.plan import plan_privacy

    n, batch, epochs = meta["lines"], meta["example_batch"], meta["example_epochs"]
    k, delta_user = LARGEST, _user_delta()
    lines = [
        "| ε per user | δ per user | ε_ex = ε/k | δ_ex | σ_ex | σ_ex/B | δ_ex by k·e^{(k−1)ε_ex} "
        "| σ_ex with it | user-level σ | σ/B |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    example_label = ROWS[4].label
    for eps in EPSILONS:
        eps_ex, delta_ex = group_privacy_example_budget(eps, delta_user, k)
        loose = delta_user / (k * math.exp((k - 1) * eps_ex))
        sigma_loose = plan_privacy(
            dataset_size=n,
            batch_size=batch,
            epochs=epochs,
            clipping="exact",
            k=None,
            target_epsilon=eps_ex,
            delta=loose,
        ).noise_multiplier
        ex = [c["sigma"] for c in got.get((example_label, eps), {}).values()]
        user = [c["sigma"] for c in got.get((BASE, eps), {}).values()]
        sig_ex = f"{ex[0]:.1f} | {ex[0] / batch:.2f}" if ex else "— | —"
        sig_user = f"{user[0]:.3f} | {user[0] / USER_BATCH:.4f}" if user else "— | —"
        lines.append(
            f"| {eps:g} | {delta_user:g} | {eps_ex:g} | {delta_ex:.3g} | {sig_ex} "
            f"| {loose:.3g} | {sigma_loose:.1f} | {sig_user} |"
        )
    return lines


def _lines_of(row: Row, meta: dict[str, Any]) -> float:
    if row.unit == "user":
        return meta["lines_per_step"][str(row.m)]
    return meta["example_batch"]


def report() -> str:
    cells = _load()
    meta = cells.get("_meta")
    if meta is None:
        return "no cells yet"
    got: dict[tuple[str, float | None], dict[int, dict[str, Any]]] = {}
    for key, cell in cells.items():
        if key != "_meta":
            label, eps, seed = _parse(key)
            got.setdefault((label, eps), {})[seed] = cell
    seeds = sorted({s for by in got.values() for s in by})
    wall = sum(c.get("wall", 0.0) for k, c in cells.items() if k != "_meta")
    init = {s: c["test"] for s, c in got.get(("initial model", None), {}).items()}
    text = [
        "## User-level DP-SGD(-RC) against example-level DP-SGD by group privacy (issue 31)",
        "",
        f"`{meta['command'].strip()}` — {meta['machine']}, each cell in its own process, "
        f"seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}); the cells' training and evaluation add "
        f"up to {wall / 60:.1f} min (process start-up not counted). Raw cells: "
        "[user_level.json](user_level.json).",
        "",
        f"Data: {meta['lines']} training lines of {WIDTH} characters from {meta['users']} "
        f"users; lines per user from 1 to {meta['largest']} (Zipf: the r-th largest user holds "
        f"max(1, ⌊{LARGEST}/r⌋)), median {meta['median_lines']:g}, "
        f"{meta['users_one_line']} users with one line, the 10 largest hold "
        f"{100 * meta['top10_share']:.0f} % of the lines. Held-out: {meta['test_lines']} lines "
        f"of {meta['test_users']} other users (the same law, largest {TEST_LARGEST}). Test "
        "loss: nats per character, the mean over held-out lines (lower is better); the "
        f"unigram character model scores {meta['unigram']:.3f}.",
        "",
        "### The group-privacy conversion (k = 200 lines, the largest user)",
        "",
        *_conversion_table(meta, got),
        "",
        f"Example-level rows: expected batch {meta['example_batch']:.1f} lines "
        f"(q = {meta['example_batch'] / meta['lines']:.4f}), {STEPS} steps; user-level rows: "
        f"expected batch {USER_BATCH} users (q = {USER_BATCH / USERS:.3f}), {STEPS} steps.",
        "",
    ]
    for eps in EPSILONS:
        text += [
            f"### ε = {eps:g} per user",
            "",
            "| row | σ | q | lines a step (expected) | seeds | test loss | − user exact m=8 "
            "(paired) | − initial model (paired) | planner warns | s/step |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        base = {s: c["test"] for s, c in got.get((BASE, eps), {}).items()}
        for row in ROWS + REFERENCES:
            by = got.get((row.label, None if row.unit in ("init", "nonprivate") else eps), {})
            if not by:
                continue
            vals = {s: c["test"] for s, c in by.items()}
            first = by[min(by)]
            sigma = _sigmas([c["sigma"] for c in by.values()])
            q = f"{first['sample_rate']:.4f}" if "sample_rate" in first else "—"
            lines = "—" if row.unit == "init" else f"{_lines_of(row, meta):.1f}"
            warns = "—"
            if "learnability_warning" in first:
                warns = f"{sum(c['learnability_warning'] for c in by.values())}/{len(by)}"
            sps = [c["sec_per_step"] for c in by.values() if c.get("sec_per_step") is not None]
            text.append(
                f"| {row.label} | {sigma} | {q} | {lines} | {len(by)} "
                f"| {_mean_se(list(vals.values()))} "
                f"| {'—' if row.label == BASE else _paired(vals, base)} "
                f"| {'—' if row.unit == 'init' else _paired(vals, init)} "
                f"| {warns} | {f'{statistics.median(sps):.3f}' if sps else '—'} |"
            )
        text.append("")
    generated = "\n".join(text)
    reading = ""
    if DOC.exists() and READING in DOC.read_text():
        reading = DOC.read_text().split(READING, 1)[1]
    DOC.write_text(generated + "\n" + READING + reading)
    return generated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    labels = [r.label for r in ROWS + REFERENCES]
    ap.add_argument("--rows", nargs="+", choices=labels, default=labels, metavar="LABEL")
    ap.add_argument("--report", action="store_true", help="only tabulate the saved cells")
    ap.add_argument("--cell", help=argparse.SUPPRESS)  # internal: run one cell (label|ε|seed)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.cell:
        args.out.write_text(json.dumps(run_cell(args.cell, args.work)))
        return
    if not args.report:
        run(args.seeds, args.rows)
    print(report())


if __name__ == "__main__":
    main()
