"""Data sets at scale (issue 28): the tokenized store's build and reuse against the tokenizer's
own throughput, and the worker's memory, at N = 10k, 100k and 1M examples of 128 tokens.

Per N, in fresh processes (so that the peaks are the configuration's own):

* **tokenizer alone** — ``tokenizer(texts, truncation=True, max_length=128)`` over the same
  texts in batches of 1024, texts already in memory: the throughput to compare with;
* **first job** — ``run_job`` of a one-step MiniLM classification job (the worker's code path:
  model, store build, plan, one DP step, the final checkpoint): the store's build time (from
  its progress lines), the time to the first step's end, and the peak RSS above the RSS after
  the model is loaded (``VmHWM`` reset with ``/proc/self/clear_refs``), against the issue's
  bound of 64 MB + 8 bytes a token;
* **second job** on the same file: time to the first step's end (the store is reused).

The file's lines are ``{"text", "label"}`` with texts of about 128 MiniLM tokens.

    .venv/bin/python benchmarks/data_scale.py [--n 10000 100000 1000000]
    # writes docs/benchmarks/data.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "benchmarks" / "data.md"
WORDS = "the of and a to in is was he for it with as his on be at by i this had not are but".split()


def _rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def make_file(path: Path, n: int) -> None:
    """n lines of about 128 MiniLM tokens each (126 words plus [CLS] and [SEP])."""
    with open(path, "w") as f:
        for i in range(n):
            words = [WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(126)]
            f.write(json.dumps({"text": f"{i} " + " ".join(words), "label": i % 2}) + "\n")


def tokenizer_alone(path: str) -> dict:
    from transformers import AutoTokenizer

    from tests.conftest import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    with open(path, "rb") as f:
        texts = [json.loads(line)["text"] for line in f]
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 1024):
        ids = tok(texts[i : i + 1024], truncation=True, max_length=128)["input_ids"]
        tokens += sum(len(x) for x in ids)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "examples": len(texts)}


def one_job(path: str, store: str, out: str) -> dict:
    import torch

    from dprc_core.training.runner import JobSpec, run_job
    from tests.conftest import minilm_path

    torch.set_num_threads(os.cpu_count() or 1)
    n = sum(1 for _ in open(path, "rb"))
    spec = JobSpec(
        model=str(minilm_path()),
        task="classification",
        train_file=path,
        output_dir=out,
        epochs=64 / n,  # one step at expected batch 64
        batch_size=64,
        learning_rate=1e-3,
        max_seq_len=128,
        target_epsilon=8.0,
        norm_method="exact",
        train_only=["classifier"],
        seed=0,
        token_store=store,
    )
    # the model's RSS first: the same loading the job does, then dropped
    from dprc_core.training.models import load_model

    model = load_model(Path(spec.model), "classification", num_labels=2)
    del model
    base = _rss_mib()
    reset = _reset_peak()
    marks: dict[str, float] = {}
    start = time.perf_counter()

    def on_event(message: str) -> None:
        if message.startswith("Tokenized") and "of" in message:
            marks["built"] = time.perf_counter() - start
        if message.startswith("Reusing"):
            marks["opened"] = time.perf_counter() - start

    result = run_job(spec, on_event=on_event, resume=False)
    total = time.perf_counter() - start
    return {
        "steps": result.steps,
        "to_first_step_end": total,
        "store_ready": marks.get("built", marks.get("opened")),
        "reused": "opened" in marks,
        "base_rss_mib": base,
        "peak_rss_mib": _rss_mib("VmHWM"),
        "peak_reset": reset,
    }


def data_phase(path: str, store: str, out: str) -> dict:
    """The job's data alone: the store built (or opened) and 20 Poisson-size batches sliced,
    peak RSS above the RSS with the model and tokenizer loaded."""
    import torch

    from dprc_core.training.models import load_model
    from dprc_core.training.runner import JobSpec, load_job_data
    from tests.conftest import minilm_path

    n = sum(1 for _ in open(path, "rb"))
    spec = JobSpec(
        model=str(minilm_path()),
        task="classification",
        train_file=path,
        output_dir=out,
        max_seq_len=128,
        token_store=store,
    )
    model = load_model(Path(spec.model), "classification", num_labels=2)
    from dprc_core.training.models import load_tokenizer

    load_tokenizer(spec.model)
    base = _rss_mib()
    reset = _reset_peak()
    start = time.perf_counter()
    data = load_job_data(spec)
    ready = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        index = torch.nonzero(torch.rand(n, generator=generator) < 64 / n).flatten()
        data.train.batch(index)
    del model
    return {
        "store_ready": ready,
        "base_rss_mib": base,
        "peak_rss_mib": _rss_mib("VmHWM"),
        "peak_reset": reset,
    }


def run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "tokenizer":
            result = tokenizer_alone(*rest)
        elif kind == "data":
            result = data_phase(*rest)
        else:
            result = one_job(*rest)
        print(json.dumps(result), flush=True)
        return 0
    rows = []
    for n in args.n:
        with tempfile.TemporaryDirectory(prefix="dprc-data-") as tmp:
            path = Path(tmp) / "train.jsonl"
            make_file(path, n)
            size = path.stat().st_size
            alone = run_child("tokenizer", str(path))
            data = run_child("data", str(path), str(Path(tmp) / "data-store"), tmp)
            store = str(Path(tmp) / "store")
            first = run_child("job", str(path), store, str(Path(tmp) / "out1"))
            second = run_child("job", str(path), store, str(Path(tmp) / "out2"))
            store_bytes = sum(p.stat().st_size for p in Path(store).rglob("*") if p.is_file())
            row = {
                "n": n,
                "file_mb": size / 1e6,
                "tokens": alone["tokens"],
                "tokenizer_s": alone["seconds"],
                "build_s": data["store_ready"],
                "data_rss_above_model_mib": data["peak_rss_mib"] - data["base_rss_mib"],
                "first_s": first["to_first_step_end"],
                "second_s": second["to_first_step_end"],
                "second_reused": second["reused"],
                "job_rss_above_model_mib": first["peak_rss_mib"] - first["base_rss_mib"],
                "bound_mib": 64 + 8 * alone["tokens"] / 2**20,
                "second_rss_above_model_mib": second["peak_rss_mib"] - second["base_rss_mib"],
                "store_mb": store_bytes / 1e6,
            }
            print(row, flush=True)
            rows.append(row)
    head = (
        "| N | file (MB) | tokens | tokenizer alone (s) | store build (s) | build / tokenizer "
        "| data's peak RSS above model + tokenizer (MiB) | bound 64 MB + 8 B/token (MiB) "
        "| first job: to first step end (s) | second job (s), store reused "
        "| job's peak RSS above the model: first / second (MiB) | store on disk (MB) |\n"
        + "|"
        + " --- |" * 12
        + "\n"
    )
    body = "".join(
        f"| {r['n']:,} | {r['file_mb']:.0f} | {r['tokens']:,} | {r['tokenizer_s']:.1f} | "
        f"{r['build_s']:.1f} | {r['build_s'] / r['tokenizer_s']:.2f}× | "
        f"{r['data_rss_above_model_mib']:.0f} | {r['bound_mib']:.0f} | {r['first_s']:.1f} | "
        f"{r['second_s']:.1f}{'' if r['second_reused'] else ' (rebuilt!)'} | "
        f"{r['job_rss_above_model_mib']:.0f} / {r['second_rss_above_model_mib']:.0f} | "
        f"{r['store_mb']:.0f} |\n"
        for r in rows
    )
    text = (
        "# Data sets at scale\n\n"
        f"Generated by `benchmarks/data_scale.py` on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}: MiniLM's fast tokenizer, "
        "examples of about 128 tokens, `max_seq_len` 128, a one-step job (the worker's "
        "`run_job`: model, store, plan, one DP step, final checkpoint). The store build "
        "includes hashing the file, validating every line and the checksums. The data's peak "
        "is the store's build and opening plus 20 Poisson batches sliced from it (the bound "
        "of issue 28); the job's peak adds the engine, the optimizer and one step's "
        "activations (B = 64, T = 128), which do not grow with N.\n\n" + head + body
    )
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
