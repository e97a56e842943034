"""Experiment 2 of issue 8: ν-DP-FTRL vs DP-SGD on a small causal LM, several epochs.

Everything goes through the job runner (``dprc_core.training.run_job``), as a user's job would:

* **Data** — real English prose available offline: the paragraphs of CPython's own reference
  documentation shipped as ``pydoc_data.topics`` (the text behind ``help("if")`` etc.).
  Indented blocks (grammar, code) and underline headings are dropped; each prose paragraph is
  joined to one line and word-wrapped to ≤ 64 characters; pieces under 16 characters are dropped.
  The split is **by topic** (no paragraph is shared): topics are shuffled (seed 0), held-out
  topics are taken until they give ≥ N_test lines, then N_train training lines and N_test
  held-out lines are drawn (seed 0) from the two pools. One line = one example = the privacy
  unit. Tokenizer: the tiny model's character tokenizer (one token per character).
* **Model** — ``build_tiny_llama(hidden=64, layers=2)``: a Llama **initialised locally at
  random** (nothing pretrained or downloaded), the same initial weights for every run; the seed
  of a run drives its batch order / Poisson sampling and its noise.
* **Mechanisms** at each ε (δ = the runner's default 1/N^1.1, the same for all), same epochs,
  same (expected) batch size, Adam, exact per-sample clipping at C = 1:
  - **DP-SGD (Poisson)**: ``noise_mechanism="gaussian"`` — Poisson sampling at q = B/N,
    independent noise, σ from the RDP/PRV accountant **with amplification by sampling**;
  - **DP-SGD (no amp.)**: ``noise_mechanism="nu_dpftrl", bands=1`` — fixed-order batches and
    independent noise (β = (1)), accounted by the matrix mechanism with sensitivity √epochs and
    no amplification: isolates the effect of the correlation;
  - **ν-DP-FTRL**: ``noise_mechanism="nu_dpftrl"``, fixed-order batches, correlated noise,
    for a few ν (un-banded by default), no amplification;
  - **non-private** reference: a plain torch loop (no clipping, no noise, Adam, the same
    fixed-order batches and steps) — the accountant refuses σ → 0, so this is not a runner job.
* **Metric** — held-out loss of the final checkpoint, ``evaluate(model, heldout, "causal_lm")``
  (mean over held-out lines of each line's mean next-token cross-entropy, nats/character).
  Learning rate chosen per (method, ε) on a small grid by the mean over the reported seeds
  (oracle tuning on the reported held-out set, identical for every method; tuning itself is
  not privately accounted).

    .venv/bin/python benchmarks/dpftrl_lm.py            # writes docs/benchmarks/dpftrl_lm.md
    .venv/bin/python benchmarks/dpftrl_lm.py --quick    # a smoke run, prints only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import numpy as np
import torch

from benchmarks.kit.pages import ROOT  # noqa: E402
from dprc_core.losses import causal_lm_per_sample_loss
from dprc_core.training.data import Examples, tokenize
from dprc_core.training.models import load_model, load_tokenizer
from dprc_core.training.plan import plan_privacy
from dprc_core.training.runner import JobSpec, evaluate, run_job
from dprc_core.training.tiny import build_tiny_llama

DOCS = ROOT / "docs"
WIDTH = 64  # characters per line (= tokens: character tokenizer)
MIN_CHARS = 16


# ----------------------------------------------------------------------------------- data


def prose_lines(text: str) -> list[str]:
    """Prose paragraphs of one pydoc topic, each joined and wrapped to ≤ WIDTH characters."""
    out = []
    for para in text.split("\n\n"):
        rows = [r for r in para.split("\n") if r.strip()]
        if not rows or any(r.startswith(" ") for r in rows):
            continue  # indented: grammar productions, code, tables
        if len(rows) >= 2 and set(rows[-1].strip()) <= set("*=-~^"):
            continue  # a heading with its underline
        joined = " ".join(" ".join(rows).split())
        if not joined.isascii() or not joined.isprintable():
            continue
        out += [piece for piece in textwrap.wrap(joined, WIDTH) if len(piece) >= MIN_CHARS]
    return out


def make_data(n_train: int, n_test: int) -> tuple[list[str], list[str], dict]:
    from pydoc_data.topics import topics

    names = sorted(topics)
    random.Random(0).shuffle(names)
    held_topics, held_pool, train_pool = [], [], []
    for name in names:
        lines = prose_lines(topics[name])
        if len(held_pool) < n_test:
            held_topics.append(name)
            held_pool += lines
        else:
            train_pool += lines
    if len(train_pool) < n_train:
        raise SystemExit(f"only {len(train_pool)} training lines available, asked {n_train}")
    rng = random.Random(0)
    train = rng.sample(train_pool, n_train)
    test = rng.sample(held_pool, n_test)
    info = dict(
        topics=len(names),
        held_topics=len(held_topics),
        train_pool=len(train_pool),
        held_pool=len(held_pool),
        train_chars=sum(map(len, train)) / n_train,
        test_chars=sum(map(len, test)) / n_test,
    )
    return train, test, info


# ------------------------------------------------------------------------------------ runs


def nonprivate_run(
    model_dir: Path, train, test_data, lr: float, seed: int, batch: int, epochs: int
) -> float:
    """Plain Adam on the same fixed-order batches (shuffle once, cycle), no clipping/noise."""
    model = load_model(model_dir, "causal_lm").train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    for _ in range(epochs):
        for chunk in order.split(batch):
            loss = causal_lm_per_sample_loss(model, train.batch(chunk)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return evaluate(model, test_data, "causal_lm")


def private_run(
    model_dir: Path,
    train_file: Path,
    workdir: Path,
    test_data,
    method: dict,
    sigma: float,
    lr: float,
    seed: int,
    batch: int,
    epochs: int,
    max_seq_len: int,
) -> tuple[float, float]:
    """One runner job; returns (held-out loss of the final checkpoint, ε the runner reports)."""
    out = workdir / f"job-{os.getpid()}-{time.monotonic_ns()}"
    spec = JobSpec(
        model=str(model_dir),
        task="causal_lm",
        train_file=str(train_file),
        output_dir=str(out),
        epochs=epochs,
        batch_size=batch,
        learning_rate=lr,
        optimizer="adam",
        max_seq_len=max_seq_len,
        target_epsilon=None,
        noise_multiplier=sigma,
        max_grad_norm=1.0,
        clipping="exact",
        seed=seed,
        max_physical_batch_size=batch,
        device="cpu",
        report_train_loss=False,
        epsilon_every=10**6,
        noise_mechanism=method["mechanism"],
        nu=method.get("nu"),
        bands=method.get("bands"),
    )
    try:
        result = run_job(spec, resume=False)
        model = load_model(Path(result.checkpoint) / "model", "causal_lm")
        return evaluate(model, test_data, "causal_lm"), result.epsilon
    finally:
        shutil.rmtree(out, ignore_errors=True)


def methods_for(nus: list[float], bands: int | None) -> list[dict]:
    out = [
        {"key": "dpsgd-poisson", "name": "DP-SGD (Poisson)", "mechanism": "gaussian"},
        {
            "key": "dpsgd-fixed",
            "name": "DP-SGD (no amp.)",
            "mechanism": "nu_dpftrl",
            "nu": 0.0,
            "bands": 1,
        },
    ]
    out += [
        {
            "key": f"ftrl-{nu:g}",
            "name": f"ν-DP-FTRL ν={nu:g}",
            "mechanism": "nu_dpftrl",
            "nu": nu,
            "bands": bands,
        }
        for nu in nus
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    ap.add_argument("--epsilon", type=float, nargs="+", default=[2.0, 8.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--nu", type=float, nargs="+", default=[0.05, 0.2])
    ap.add_argument("--bands", type=int, default=0, help="ν-DP-FTRL bands (0: un-banded)")
    ap.add_argument(
        "--lr",
        type=float,
        nargs="+",
        default=[3e-3, 1e-2, 3e-2, 1e-1],
        help="learning-rate grid of the private methods",
    )
    ap.add_argument(
        "--np-lr",
        type=float,
        nargs="+",
        default=[1e-3, 3e-3, 1e-2],
        help="learning-rate grid of the non-private reference",
    )
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bands = args.bands or None
    if args.quick:
        n_train, n_test, batch, epochs, seeds = 128, 64, 32, 2, 1
        lrs, np_lrs, epsilons = [3e-3], [3e-3], [8.0]
    else:
        n_train, n_test, batch, epochs, seeds = 384, 128, 32, args.epochs, args.seeds
        lrs, np_lrs, epsilons = args.lr, args.np_lr, args.epsilon
    max_seq_len = WIDTH
    t0 = time.perf_counter()
    train_lines, test_lines, info = make_data(n_train, n_test)
    workdir = Path(tempfile.mkdtemp(prefix="dpftrl_lm_"))
    try:
        model_dir = build_tiny_llama(
            workdir / "tiny", hidden=64, layers=2, max_positions=128, seed=0
        )
        train_file = workdir / "train.jsonl"
        train_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in train_lines))
        tok = load_tokenizer(model_dir)
        train_data = tokenize(Examples("causal_lm", train_lines), tok, max_seq_len)
        test_data = tokenize(Examples("causal_lm", test_lines), tok, max_seq_len)
        init_loss = evaluate(load_model(model_dir, "causal_lm"), test_data, "causal_lm")
        methods = methods_for(args.nu, bands)
        plans = {}
        for eps in epsilons:
            for m in methods:
                plans[(eps, m["key"])] = plan_privacy(
                    dataset_size=n_train,
                    batch_size=batch,
                    epochs=epochs,
                    clipping="exact",
                    k=None,
                    target_epsilon=eps,
                    mechanism=m["mechanism"],
                    nu=m.get("nu"),
                    bands=m.get("bands"),
                )
        results: dict = {}
        walls: dict = {}
        t = time.perf_counter()
        results["nonprivate"] = np.array(
            [
                [
                    nonprivate_run(model_dir, train_data, test_data, lr, s, batch, epochs)
                    for lr in np_lrs
                ]
                for s in range(seeds)
            ]
        )
        walls["nonprivate"] = (time.perf_counter() - t) / (seeds * len(np_lrs))
        print(f"non-private done at {time.perf_counter() - t0:.0f}s", flush=True)
        spent: dict = {}
        for eps in epsilons:
            for m in methods:
                plan = plans[(eps, m["key"])]
                t = time.perf_counter()
                cell = np.zeros((seeds, len(lrs)))
                eps_seen = []
                for s in range(seeds):
                    for j, lr in enumerate(lrs):
                        cell[s, j], e = private_run(
                            model_dir,
                            train_file,
                            workdir,
                            test_data,
                            m,
                            plan.noise_multiplier,
                            lr,
                            s,
                            batch,
                            epochs,
                            max_seq_len,
                        )
                        eps_seen.append(e)
                results[(eps, m["key"])] = cell
                spent[(eps, m["key"])] = max(eps_seen)
                walls[(eps, m["key"])] = (time.perf_counter() - t) / (seeds * len(lrs))
                print(
                    f"eps={eps:g} {m['name']}: {cell.mean(0).round(4).tolist()} "
                    f"at {time.perf_counter() - t0:.0f}s",
                    flush=True,
                )
        wall = time.perf_counter() - t0
        config = dict(
            n_train=n_train,
            n_test=n_test,
            batch=batch,
            epochs=epochs,
            seeds=seeds,
            lrs=lrs,
            np_lrs=np_lrs,
            bands=bands,
            steps=plans[(epsilons[0], methods[0]["key"])].steps,
            delta=plans[(epsilons[0], methods[0]["key"])].delta,
            params=sum(p.numel() for p in load_model(model_dir, "causal_lm").parameters()),
            init_loss=init_loss,
            **info,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = render(results, plans, spent, walls, methods, epsilons, config, wall, args.quick)
    print(report)
    if not args.quick and not args.no_write:
        (DOCS / "benchmarks" / "dpftrl_lm.md").write_text(report)
        plot(results, methods, epsilons, config)
        print(f"wrote docs/benchmarks/dpftrl_lm.md ({wall:.0f}s)")


# ---------------------------------------------------------------------------------- report


def best(cell: np.ndarray) -> tuple[float, float, int]:
    """(mean, std over seeds) at the learning rate with the smallest mean, and its index."""
    means = cell.mean(axis=0)
    i = int(np.argmin(means))
    std = float(cell[:, i].std(ddof=1)) if cell.shape[0] > 1 else 0.0
    return float(means[i]), std, i


def render(results, plans, spent, walls, methods, epsilons, c, wall, quick) -> str:
    lrs = c["lrs"]
    lines = [
        "## ν-DP-FTRL vs DP-SGD on a small causal LM (issue 8, experiment 2)",
        "",
        f"`.venv/bin/python benchmarks/dpftrl_lm.py{' --quick' if quick else ''}` — "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"{os.cpu_count()} cores (shared), Python {platform.python_version()}, torch "
        f"{torch.__version__}, 1 thread; wall time {wall:.0f} s.",
        "",
        f"**Data**: prose paragraphs of CPython {platform.python_version()}'s `pydoc_data.topics` "
        f"(the reference text behind `help()`), wrapped to ≤ {WIDTH} characters; split by topic "
        f"({c['held_topics']} of {c['topics']} topics held out): N = {c['n_train']} training "
        f"lines (mean {c['train_chars']:.0f} characters) drawn from {c['train_pool']}, "
        f"{c['n_test']} held-out lines (mean {c['test_chars']:.0f}) drawn from "
        f"{c['held_pool']}. One line = one example = the privacy unit. "
        f"**Model**: `build_tiny_llama(hidden=64, layers=2)` — a Llama of {c['params']:,} "
        "parameters initialised locally at random (nothing pretrained), character tokenizer "
        f"(max_seq_len {WIDTH}); held-out loss of the initial model {c['init_loss']:.3f}.",
        "",
        f"**Training**: every method runs {c['epochs']} epochs = {c['steps']} steps, "
        f"(expected) batch {c['batch']}, Adam, through `run_job` with exact per-sample clipping "
        f"at C = 1; δ = {c['delta']:g} (the runner's default 1/N^1.1) for all. DP-SGD (Poisson) "
        "samples with q = B/N and is accounted **with amplification by sampling**; DP-SGD "
        "(no amp.) and ν-DP-FTRL use fixed-order batches (shuffle once, cycle) and the "
        "matrix-mechanism accountant **without amplification** (docs/dpftrl.md); ν-DP-FTRL "
        f"bands = {c['bands'] or 'none (un-banded)'}. All meet the same (ε, δ); σ is calibrated "
        "per mechanism. Non-private: plain Adam loop, same batches and steps, no clipping/noise. "
        f"Learning rate tuned on {{{', '.join(f'{x:g}' for x in lrs)}}} per (method, ε) "
        f"(non-private: on {{{', '.join(f'{x:g}' for x in c['np_lrs'])}}}) by "
        "the mean over the reported seeds (oracle tuning on the reported held-out set, the same "
        f"for every method). {c['seeds']} seeds (batch order / sampling and noise; same "
        "initial weights). Cells: held-out loss of the final checkpoint, "
        '`evaluate(model, heldout, "causal_lm")` = mean over held-out lines of the per-token '
        "cross-entropy (nats/character), mean ± std over seeds.",
        "",
    ]
    for eps in epsilons:
        lines += [
            f"### ε = {eps:g}",
            "",
            "| method | σ | ε planned (runner) | best lr | held-out loss | loss at lr "
            f"{' / '.join(f'{x:g}' for x in lrs)} "
            "| s / run |",
            "|---|---:|---:|---:|---:|---|---:|",
        ]
        rows = [
            (
                "non-private (reference)",
                results["nonprivate"],
                "—",
                "—",
                walls["nonprivate"],
                c["np_lrs"],
            )
        ]
        for m in methods:
            k = (eps, m["key"])
            rows.append(
                (
                    m["name"],
                    results[k],
                    f"{plans[k].noise_multiplier:.3f}",
                    f"{plans[k].planned_epsilon:.3f} ({spent[k]:.3f})",
                    walls[k],
                    lrs,
                )
            )
        for name, cell, sig, pe, w, grid in rows:
            mean, std, i = best(cell)
            each = " / ".join(f"{x:.3f}" for x in cell.mean(0))
            if name.startswith("non-private"):
                each += f" (lr {' / '.join(f'{x:g}' for x in grid)})"
            lines.append(
                f"| {name} | {sig} | {pe} | {grid[i]:g} | {mean:.3f} ± {std:.3f} | "
                f"{each} | {w:.1f} |"
            )
        lines.append("")
    lines += verdict(results, methods, epsilons)
    if not quick:
        lines += ["", "![held-out loss per method](dpftrl_lm.png)", ""]
    return "\n".join(lines) + "\n"


def verdict(results, methods, epsilons) -> list[str]:
    out = ["### Summary (computed)", ""]
    ftrl = [m for m in methods if m["key"].startswith("ftrl")]
    for eps in epsilons:
        f = min(ftrl, key=lambda m: best(results[(eps, m["key"])])[0])
        fm, fs, _ = best(results[(eps, f["key"])])
        parts = []
        for key, name in (
            ("dpsgd-poisson", "DP-SGD (Poisson)"),
            ("dpsgd-fixed", "DP-SGD (no amp.)"),
        ):
            dm, ds, _ = best(results[(eps, key)])
            parts.append(f"{name} {dm:.3f} ± {ds:.3f} (difference {dm - fm:+.3f})")
        out.append(
            f"* ε = {eps:g}: best ν-DP-FTRL ({f['name']}) {fm:.3f} ± {fs:.3f}; "
            + "; ".join(parts)
            + ". Positive difference: ν-DP-FTRL is lower (better)."
        )
    return out


def plot(results, methods, epsilons, c) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - optional ([bench] extra)
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / len(methods)
    x = np.arange(len(epsilons))
    for j, m in enumerate(methods):
        vals = [best(results[(eps, m["key"])]) for eps in epsilons]
        ax.bar(
            x + (j - (len(methods) - 1) / 2) * width,
            [v[0] for v in vals],
            width,
            yerr=[v[1] for v in vals],
            capsize=3,
            label=m["name"],
        )
    npm = best(results["nonprivate"])[0]
    ax.axhline(npm, color="k", ls="--", lw=1, label=f"non-private ({npm:.2f})")
    ax.axhline(
        c["init_loss"], color="grey", ls=":", lw=1, label=f"initial model ({c['init_loss']:.2f})"
    )
    ax.set_xticks(x, [f"ε = {eps:g}" for eps in epsilons])
    ax.set_ylabel("held-out loss (nats/char), best lr")
    lo = min(npm, *(best(results[(e, m["key"])])[0] for e in epsilons for m in methods))
    ax.set_ylim(lo - 0.3, c["init_loss"] + 0.1)
    ax.set_title(
        f"tiny Llama, N = {c['n_train']}, {c['epochs']} epochs, δ = {c['delta']:g}, "
        f"{c['seeds']} seeds"
    )
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(DOCS / "benchmarks" / "dpftrl_lm.png", dpi=110)


if __name__ == "__main__":
    main()
