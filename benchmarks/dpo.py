"""DP DPO on a tiny Llama: held-out preference accuracy at ε = 1, 3, 8 and non-private, and the
cost of a DP DPO step (issue 43, "Evidence").

Task (generated here, no download): each prompt is ``loud <word>`` or ``soft <word>`` (half
each, the word 3–6 random lowercase letters); the preferred answer is the word in upper case
after ``loud`` and in lower case after ``soft``, the non-preferred answer the other case. The
rule is in the prompt: a model that prefers one case everywhere gets half the pairs right.
Held-out pairs have their own random words. The model: ``build_tiny_llama`` (character
tokenizer, dprc's default chat template, hidden 32, 2 layers, random initialisation from the
seed; no pretraining), full fine-tuning with Adam.

Each seed s (0, 1, …) fixes the model's initialisation and the job's seed, i.e. the Poisson
batches, the noise and the sketches; every setting of one seed shares them (paired seeds). DP
rows are ``run_job`` with ``method="dpo"``: exact norms, or ``hutch`` with k = 32 (per-example
sketches), σ calibrated by the runner to the target ε. The non-private row is a plain torch
loop over the **same Poisson-sampled batches** (the job's own sampler, drawn from the same
seed; the batch sizes are checked to match the DP runs'), the loss
``dprc_core.preference.dpo_loss`` summed over the batch's pairs and divided by the expected
batch size q·N (as the engine divides), no clipping, no noise, Adam with the same learning
rate. Metrics: ``dprc_core.training.reference.preference_metrics`` on the held-out pairs after
the last step (accuracy = fraction of pairs whose reward margin is > 0).

Step cost: one logical batch of ``MICRO`` pairs (one micro-batch), the same pairs and model for
every configuration: the DP step (``engine.accumulate(dpo_loss(β), batch)`` + ``engine.step()``,
exact or hutch k = 32, σ = 1) against the non-private step (forward, ``.sum() / q·N``,
backward, Adam). Time: one warm-up step each, then interleaved rounds in one process, median.
Memory: peak RSS (``VmHWM`` after ``echo 5 > /proc/self/clear_refs``) of the first step in a
fresh process per configuration, minus the RSS once model, optimizer, engine and batch exist.

Usage::

    .venv/bin/python benchmarks/dpo.py               # writes docs/benchmarks/dpo.md
    .venv/bin/python benchmarks/dpo.py --quick       # smoke run: 2 seeds, ε = 8, prints only
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

from benchmarks.kit.memory import reset_peak_checked, status_kib  # noqa: E402
from benchmarks.kit.pages import PAGES, cpu_model, git_commit, shown, write_page  # noqa: E402

OUT = PAGES / "dpo.md"
N_TRAIN, N_VALID = 512, 256
DATA_SEED = 1234
EPOCHS, BATCH, LR, BETA = 3.0, 64, 0.01, 0.1
HIDDEN, LAYERS = 32, 2
MAX_SEQ_LEN, PHYSICAL = 48, 64
K = 32
EPSILONS = (1.0, 3.0, 8.0)
MICRO = 32  # pairs of the step-cost batch
STEP_MODELS = {"task": (HIDDEN, LAYERS), "larger": (256, 4)}
STEP_CONFIGS = ("non-private", "exact", "hutch")
NP = "non-private"


# ------------------------------------------------------------------------------------- data
def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))


def preference_line(rng: random.Random) -> dict[str, Any]:
    """One pair: ``loud w`` prefers W (upper case), ``soft w`` prefers w; the other is rejected."""
    w = _word(rng)
    loud = rng.random() < 0.5
    good, bad = (w.upper(), w) if loud else (w, w.upper())
    return {
        "input": {"messages": [{"role": "user", "content": f"{'loud' if loud else 'soft'} {w}"}]},
        "preferred_output": [{"role": "assistant", "content": good}],
        "non_preferred_output": [{"role": "assistant", "content": bad}],
    }


def write_data(folder: Path) -> tuple[Path, Path]:
    """The training and held-out files (JSONL preference lines), the same for every seed."""
    rng = random.Random(DATA_SEED)
    lines = [json.dumps(preference_line(rng)) for _ in range(N_TRAIN + N_VALID)]
    train, valid = folder / "train.jsonl", folder / "valid.jsonl"
    train.write_text("\n".join(lines[:N_TRAIN]) + "\n")
    valid.write_text("\n".join(lines[N_TRAIN:]) + "\n")
    return train, valid


def model_path(folder: Path, seed: int, hidden: int = HIDDEN, layers: int = LAYERS) -> Path:
    from dprc_core.training.tiny import build_tiny_llama

    return build_tiny_llama(
        folder / f"llama-h{hidden}-l{layers}-s{seed}", hidden=hidden, layers=layers, seed=seed
    )


def job_spec(folder: Path, model: Path, seed: int, tag: str, **fields: Any) -> Any:
    """The benchmark's job for ``seed``; ``fields``: the privacy settings (and overrides)."""
    from dprc_core.training.runner import JobSpec

    spec: dict[str, Any] = dict(
        model=str(model),
        task="causal_lm",
        train_file=str(folder / "train.jsonl"),
        validation_file=str(folder / "valid.jsonl"),
        output_dir=str(folder / "runs" / f"{tag}-s{seed}"),
        epochs=EPOCHS,
        batch_size=BATCH,
        learning_rate=LR,
        max_seq_len=MAX_SEQ_LEN,
        seed=seed,
        max_physical_batch_size=PHYSICAL,
        token_store=str(folder / "stores"),
        method="dpo",
        beta=BETA,
        k=K,
    )
    return JobSpec(**{**spec, **fields})


# --------------------------------------------------------------------------------- accuracy
def run_nonprivate(folder: Path, seed: int) -> dict[str, Any]:
    """Plain torch DPO over the job's own Poisson batches (no clipping, no noise)."""
    from dprc_core.preference import dpo_loss
    from dprc_core.training.reference import WithReference, preference_metrics
    from dprc_core.training.runner import start_run

    t0 = time.perf_counter()
    spec = job_spec(
        folder,
        model_path(folder, seed),
        seed,
        "np",
        norm_method="exact",
        noise_multiplier=1.0,  # unused: only the sampler, data and model are taken
        target_epsilon=None,
    )
    run = start_run(spec, resume=False)
    run.engine.detach()
    model, train, valid = run.model, run.data.train, run.data.validation
    assert isinstance(valid, WithReference)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = dpo_loss(BETA)
    qn = run.plan.sample_rate * len(train)
    start = preference_metrics(model, valid, BETA, PHYSICAL)
    sizes = []
    for idx in run.sampler:
        sizes.append(len(idx))
        opt.zero_grad(set_to_none=True)
        if len(idx) == 0:
            continue
        total = sum(
            loss_fn(model, train.batch(chunk)).sum() for chunk in idx.split(PHYSICAL) if len(chunk)
        )
        assert isinstance(total, torch.Tensor)
        (total / qn).backward()
        opt.step()
    metrics = preference_metrics(model, valid, BETA, PHYSICAL)
    ref = valid.ref_logps
    return {
        "acc": metrics["valid_reward_accuracy"],
        "margin": metrics["valid_reward_margin"],
        "loss": metrics["valid_loss"],
        "sizes": sizes,
        "steps": run.plan.steps,
        "q": run.plan.sample_rate,
        "delta": run.plan.delta,
        "base_prefers": float((ref[:, 0] > ref[:, 1]).double().mean()),
        "acc_at_start": start["valid_reward_accuracy"],
        "seconds": time.perf_counter() - t0,
    }


def run_dp(folder: Path, seed: int, method: str, epsilon: float) -> dict[str, Any]:
    from dprc_core.training.runner import run_job

    t0 = time.perf_counter()
    spec = job_spec(
        folder,
        model_path(folder, seed),
        seed,
        f"{method}-e{epsilon:g}",
        norm_method=method,
        target_epsilon=epsilon,
    )
    last: dict[str, Any] = {}
    sizes: list[int] = []

    def on_progress(p: Any) -> None:
        sizes.append(p.batch_size)
        if p.checkpoint:
            last.update(
                acc=p.valid_reward_accuracy,
                margin=p.valid_reward_margin,
                loss=p.valid_loss,
                epsilon=p.epsilon,
            )

    res = run_job(spec, on_progress=on_progress, resume=False)
    return {
        **last,
        "sigma": res.plan.noise_multiplier,
        "epsilon": res.epsilon,
        "sizes": sizes,
        "seconds": time.perf_counter() - t0,
    }


def row_names(epsilons: tuple[float, ...]) -> list[str]:
    return [NP] + [f"{m} ε={e:g}" for e in epsilons for m in ("exact", "hutch")]


def accuracy_runs(
    folder: Path, seeds: list[int], epsilons: tuple[float, ...]
) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in row_names(epsilons)}
    for seed in seeds:
        np_run = run_nonprivate(folder, seed)
        rows[NP].append(np_run)
        print(f"seed {seed} {NP}: acc {np_run['acc']:.3f} ({np_run['seconds']:.1f} s)", flush=True)
        for e in epsilons:
            for m in ("exact", "hutch"):
                r = run_dp(folder, seed, m, e)
                if r["sizes"] != np_run["sizes"]:
                    raise RuntimeError(f"seed {seed} {m} ε={e}: batches differ from non-private")
                rows[f"{m} ε={e:g}"].append(r)
                print(
                    f"seed {seed} {m} ε={e:g}: acc {r['acc']:.3f} margin {r['margin']:.3f} "
                    f"σ {r['sigma']:.3f} ({r['seconds']:.1f} s)",
                    flush=True,
                )
    return rows


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def _pm(xs: list[float], scale: float = 1.0, digits: int = 1) -> str:
    m, se = mean_se([x * scale for x in xs])
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def _diff(a: list[float], b: list[float], scale: float = 1.0, digits: int = 1) -> str:
    m, se = mean_se([(x - y) * scale for x, y in zip(a, b, strict=True)])
    return f"{m:+.{digits}f} ± {se:.{digits}f}"


def accuracy_table(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    base = rows[NP]
    acc0 = [r["acc"] for r in base]
    out = [
        "| setting | σ | ε spent | held-out accuracy (%) | − non-private (paired, points) | "
        "hutch − exact (paired, points) | reward margin | held-out DPO loss | s / run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        acc = [r["acc"] for r in rs]
        dp = name != NP
        sigma = f"{rs[0]['sigma']:.4f}" if dp else "—"
        eps = f"{max(r['epsilon'] for r in rs):.3f}" if dp else "∞"
        vs_np = _diff(acc, acc0, 100) if dp else "—"
        vs_exact = "—"
        if name.startswith("hutch"):
            exact = [r["acc"] for r in rows[name.replace("hutch", "exact")]]
            vs_exact = _diff(acc, exact, 100)
        out.append(
            f"| {name} | {sigma} | {eps} | {_pm(acc, 100)} | {vs_np} | {vs_exact} | "
            f"{_pm([r['margin'] for r in rs], 1, 3)} | {_pm([r['loss'] for r in rs], 1, 3)} | "
            f"{statistics.fmean(r['seconds'] for r in rs):.1f} |"
        )
    return out


def per_seed_table(rows: dict[str, list[dict[str, Any]]], seeds: list[int]) -> list[str]:
    out = [
        "| setting | " + " | ".join(f"s{s}" for s in seeds) + " |",
        "|---|" + "---|" * len(seeds),
    ]
    for name, rs in rows.items():
        out.append(f"| {name} | " + " | ".join(f"{100 * r['acc']:.1f}" for r in rs) + " |")
    return out


# -------------------------------------------------------------------------------- step cost
def step_setup(folder: Path, config: str, model_name: str) -> tuple[Callable[[], None], int]:
    """One DPO step of ``config`` on ``MICRO`` fixed pairs with the model ``model_name``, and
    the model's number of parameters."""
    from dprc_core.preference import dpo_loss
    from dprc_core.training.runner import start_run

    hidden, layers = STEP_MODELS[model_name]
    spec = job_spec(
        folder,
        model_path(folder, 0, hidden, layers),
        0,
        f"step-{config}-{model_name}",
        norm_method="exact" if config == NP else config,
        noise_multiplier=1.0,
        target_epsilon=None,
        batch_size=MICRO,  # expected batch size q·N: the engine's divisor
    )
    run = start_run(spec, resume=False)
    idx = torch.arange(MICRO)
    batch = run.data.train.batch(idx)
    loss_fn = dpo_loss(BETA)
    qn = run.plan.sample_rate * len(run.data.train)  # = MICRO
    n_params = sum(p.numel() for p in run.model.parameters())
    if config == NP:
        run.engine.detach()
        model = run.model
        opt = torch.optim.Adam(model.parameters(), lr=LR)

        def np_step() -> None:
            opt.zero_grad(set_to_none=True)
            (loss_fn(model, batch).sum() / qn).backward()
            opt.step()

        return np_step, n_params
    engine, dp_opt = run.engine, run.optimizer

    def dp_step() -> None:
        dp_opt.zero_grad(set_to_none=True)
        engine.accumulate(loss_fn, batch, example_ids=idx)
        engine.step()

    return dp_step, n_params


def measure_one(folder: Path, config: str, model_name: str) -> dict[str, float]:
    """In a fresh process: the first step's peak RSS over the RSS once everything exists."""
    step, _ = step_setup(folder, config, model_name)
    gc.collect()
    base = status_kib("VmRSS")
    reset_peak_checked()
    t0 = time.perf_counter()
    step()
    elapsed = time.perf_counter() - t0
    return {
        "base_mib": base / 1024,
        "peak_mib": status_kib("VmHWM") / 1024,
        "first_step_s": elapsed,
    }


def measure_in_subprocess(folder: Path, config: str, model_name: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", config, model_name]
    cmd += ["--workdir", str(folder), "--threads", str(torch.get_num_threads())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


def step_runs(folder: Path, rounds: int, mem_runs: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for model_name in STEP_MODELS:
        built = {c: step_setup(folder, c, model_name) for c in STEP_CONFIGS}
        steps = {c: step for c, (step, _) in built.items()}
        n_params = built[NP][1]
        times: dict[str, list[float]] = {c: [] for c in STEP_CONFIGS}
        for c in STEP_CONFIGS:
            steps[c]()  # warm-up
        for _ in range(rounds):
            for c in STEP_CONFIGS:
                t0 = time.perf_counter()
                steps[c]()
                times[c].append(time.perf_counter() - t0)
        del steps, built
        gc.collect()
        mems: dict[str, list[dict[str, Any]]] = {c: [] for c in STEP_CONFIGS}
        for _ in range(mem_runs):  # fresh processes, interleaved
            for c in STEP_CONFIGS:
                mems[c].append(measure_in_subprocess(folder, c, model_name))
        for c in STEP_CONFIGS:
            out[f"{model_name}/{c}"] = {"times": times[c], "mem": mems[c], "params": n_params}
            print(f"step {model_name}/{c}: {statistics.median(times[c]) * 1e3:.1f} ms {mems[c]}")
    return out


def step_table(steps: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "| model | step | median ms (min–max) | × non-private time | "
        "step Δ RSS, MiB: median (min–max) | peak RSS (MiB, median) |",
        "|---|---|---|---|---|---|",
    ]
    for model_name, (hidden, layers) in STEP_MODELS.items():
        ref = statistics.median(steps[f"{model_name}/{NP}"]["times"])
        n_params = steps[f"{model_name}/{NP}"]["params"]
        label = f"{model_name} (hidden {hidden}, {layers} layers, {n_params:,} parameters)"
        for c in STEP_CONFIGS:
            r = steps[f"{model_name}/{c}"]
            t = r["times"]
            med = statistics.median(t)
            ok = [m for m in r["mem"] if "error" not in m]
            if not ok:
                delta = peak = f"error: {r['mem'][0]['error']}"
            else:
                deltas = [m["peak_mib"] - m["base_mib"] for m in ok]
                delta = f"{statistics.median(deltas):.1f} ({min(deltas):.1f}–{max(deltas):.1f})"
                peak = f"{statistics.median(m['peak_mib'] for m in ok):.1f}"
            name = "DP exact" if c == "exact" else "DP hutch k=32" if c == "hutch" else NP
            out.append(
                f"| {label} | {name} | {med * 1e3:.1f} ({min(t) * 1e3:.1f}–{max(t) * 1e3:.1f}) | "
                f"{med / ref:.2f}× | {delta} | {peak} |"
            )
    return out


# ----------------------------------------------------------------------------------- report
def machine_facts() -> list[str]:
    import transformers

    return [
        f"- CPU: {cpu_model()}; `nproc` {os.cpu_count()} ({len(os.sched_getaffinity(0))} usable), "
        f"torch threads {torch.get_num_threads()}; shared with other work",
        f"- Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; commit {git_commit()}",
        f"- load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def write_doc(
    cmd: str,
    facts: list[str],
    seeds: list[int],
    rows: dict[str, list[dict[str, Any]]],
    steps: dict[str, dict[str, Any]] | None,
    rounds: int,
    mem_runs: int,
    wall_s: float,
    reading: str,
) -> None:
    base = rows[NP]
    n_steps, q, delta = base[0]["steps"], base[0]["q"], base[0]["delta"]
    prefers = [r["base_prefers"] for r in base]
    text = [
        "# DP DPO: preference accuracy against ε, and the step's cost (issue 43)",
        "",
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} by `{cmd}` "
        f"({wall_s / 60:.1f} min).",
        "",
        *facts,
        "",
        "## Task",
        "",
        "Preference lines in OpenAI's format, generated by the script (no download). The prompt "
        "is `loud <word>` or `soft <word>` (half each; the word 3–6 random lowercase letters); "
        "the preferred answer is the word in UPPER case after `loud` and in lower case after "
        "`soft`, the non-preferred answer the other case. The rule is in the prompt: preferring "
        "one case everywhere gets half the pairs right. "
        f"N = {N_TRAIN} training pairs (each pair one privacy unit, clipped once), "
        f"{N_VALID} held-out pairs with their own words (data seed {DATA_SEED}).",
        "",
        f"Model: `build_tiny_llama(hidden={HIDDEN}, layers={LAYERS}, seed=s)` (character "
        "tokenizer, dprc's default chat template), random initialisation, no pretraining, full "
        "fine-tuning. The base model does not already prefer the rule: over the held-out pairs "
        "it gives the preferred answer the higher log-probability for "
        f"{_pm(prefers, 100)} % of them (mean ± SE over the seeds' initialisations); the "
        "reward accuracy below starts at "
        f"{_pm([r['acc_at_start'] for r in base], 100)} %, not 50 % (at step 0 the policy is "
        "the reference: every margin is 0, and only a margin > 0 counts). A model that ignores "
        "the prompt gets 50 %.",
        "",
        f"Job: `JobSpec(task='causal_lm', method='dpo', beta={BETA}, epochs={EPOCHS:g}, "
        f"batch_size={BATCH}, learning_rate={LR}, optimizer='adam', max_seq_len={MAX_SEQ_LEN}, "
        f"max_physical_batch_size={PHYSICAL}, max_grad_norm=1.0, k={K}, seed=s)`: Poisson "
        f"sampling at q = {q:.4f}, {n_steps} steps, δ = {delta:.3g}; σ calibrated by the runner "
        "to the target ε (exact norms, or `hutch` with per-example sketches). The reference "
        "is the starting model.",
        "",
        "Non-private: **not** dprc's engine with a huge ε, but a plain torch loop over the "
        "**same Poisson-sampled batches** (the job's own sampler from the same seed; every "
        "step's batch size is checked equal to the DP runs'), loss "
        "`dprc_core.preference.dpo_loss(β)` summed over the batch's pairs and divided by q·N "
        "(the engine's divisor), no clipping, no noise, `torch.optim.Adam` with the same "
        "learning rate.",
        "",
        f"Seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}), paired: seed s fixes the initialisation, "
        "the Poisson batches, the noise and the sketches of every row. Metrics after the last "
        "step on the held-out pairs (`preference_metrics`): accuracy = fraction of pairs whose "
        "reward margin β·[(log π(y⁺) − log π_ref(y⁺)) − (log π(y⁻) − log π_ref(y⁻))] is > 0; "
        "mean ± standard error over seeds; differences are taken per seed.",
        "",
        "## Held-out preference accuracy",
        "",
        *accuracy_table(rows),
        "",
        "Per seed, held-out accuracy (%):",
        "",
        *per_seed_table(rows, seeds),
        "",
    ]
    if steps is not None:
        text += [
            "## Step time and memory",
            "",
            f"One logical batch of {MICRO} pairs (the first {MICRO} training pairs, one "
            "micro-batch, 2 rows per pair), the same pairs and model weights for every row; "
            "expected batch size and divisor "
            f"{MICRO}; DP steps with σ = 1 (`engine.accumulate(dpo_loss(β), batch)` + "
            "`engine.step()`, Adam), non-private = forward, `.sum() / 32`, backward, Adam. "
            f"Time: one warm-up step each, then {rounds} interleaved rounds in one process; "
            "median (min–max) wall time. Memory: **peak RSS** (`VmHWM` after "
            "`echo 5 > /proc/self/clear_refs`, not tracemalloc) of the first step in a fresh "
            "process, reset once model, optimizer, engine and batch exist; step Δ = that peak − "
            f"the RSS just before the step; {mem_runs} fresh processes per row, interleaved, "
            "median and (min–max): glibc's allocator makes this peak vary between identical "
            "processes.",
            "",
            *step_table(steps),
            "",
        ]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text += [f"Load average at the end: {load}.", "", "## Reading", "", reading, ""]
    write_page(OUT, "\n".join(text))


READING_START, READING_END = "<!-- reading -->", "<!-- /reading -->"


def kept_reading() -> str:
    from benchmarks.kit.pages import kept

    return kept(OUT, READING_START, READING_END) or (
        f"{READING_START}\n(to be written for the numbers above)\n{READING_END}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..n-1 (default 5)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds of the step table")
    parser.add_argument("--mem-runs", type=int, default=3, help="fresh processes per step row")
    parser.add_argument("--quick", action="store_true", help="2 seeds, ε = 8, 3 rounds; prints")
    parser.add_argument("--no-steps", action="store_true", help="skip the step-cost table")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--one", nargs=2, metavar=("CONFIG", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")

    if args.one:
        assert args.workdir is not None
        print(json.dumps(measure_one(args.workdir, *args.one)))
        return 0

    started = time.perf_counter()
    facts = machine_facts()
    seeds = list(range(2 if args.quick else args.seeds))
    epsilons = (8.0,) if args.quick else EPSILONS
    rounds = 3 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="dprc-dpo-") as tmp:
        folder = Path(tmp)
        write_data(folder)
        rows = accuracy_runs(folder, seeds, epsilons)
        for line in accuracy_table(rows):
            print(line)
        mem_runs = 1 if args.quick else args.mem_runs
        steps = None if args.no_steps else step_runs(folder, rounds, mem_runs)
        if steps is not None:
            for line in step_table(steps):
                print(line)
    if args.quick:
        return 0
    cmd = " ".join(
        ["python", shown(Path(sys.argv[0])), *(argv if argv is not None else sys.argv[1:])]
    )
    write_doc(
        cmd,
        facts,
        seeds,
        rows,
        steps,
        rounds,
        mem_runs,
        time.perf_counter() - started,
        kept_reading(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
