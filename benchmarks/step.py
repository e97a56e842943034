"""One training step of a small Llama: non-private vs dprc (exact, hutch, hutch++) vs Opacus ghost.

Model: ``LlamaForCausalLM`` with 4 layers, hidden 256, intermediate 688, 8 heads (4 KV heads),
vocab 4096, float32, ``model.train()``. It is built once with a fixed seed, saved with
``save_pretrained`` under ``.bench/`` (gitignored) and loaded back with
``from_pretrained(path, use_safetensors=True, trust_remote_code=False)``, the path users take.
Batch: B = 2 random token sequences of length T, labels = inputs, loss =
``dprc_core.losses.causal_lm_per_sample_loss`` (its ``.mean()`` for the non-private step; Opacus's
ghost criterion computes the same per-sequence token mean). Optimizer: plain SGD.

Time (docs/design.md §5): for each T, every configuration gets its own copy of the model (same
weights); after one warm-up step each, steps run interleaved A B C … A B C … in one process, and
medians are compared as ratios to the non-private median of the same run.

Peak memory: a fresh process per (configuration, T) (``--one CONFIG T``). It builds the model,
optimizer, engine and batch, collects garbage, reads the RSS (the *baseline*), resets the
high-water mark with ``echo 5 > /proc/self/clear_refs`` and runs the **first** step; the peak is
``VmHWM`` afterwards. So "peak RSS" is the process peak during one step once the model and the
inputs exist, and "step Δ" is that peak minus the baseline. One-time lazy allocations of a first
step are the same for every configuration; every process imports the same modules (Opacus
included when installed). With glibc's default allocator this peak varies by up to ~15%
between identical processes (its dynamic mmap threshold puts tensors under 32 MiB on a heap that
fragments, depending on thread timing), so T=2048 takes the median of 3 processes; one more
process with ``MALLOC_MMAP_THRESHOLD_=131072`` (every tensor its own mapping, unmapped when freed)
gives the *live* peak, repeatable to < 1 MiB. On CUDA the process reports
``torch.cuda.max_memory_allocated`` (reset before the step) instead, and step times are taken
between ``torch.cuda.synchronize()`` calls.

Usage::

    .venv/bin/python benchmarks/step.py            # full run, writes docs/benchmarks/step.md
    .venv/bin/python benchmarks/step.py --quick    # smoke run: T=128, 2 rounds, prints only
    .venv/bin/python benchmarks/step.py --device cuda   # writes docs/benchmarks/step_cuda.md
    .venv/bin/python benchmarks/step.py --profile hutch/two_pass 2048   # torch.profiler table
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.kit.device import sync  # noqa: E402
from benchmarks.kit.memory import reset_peak_checked, status_kib  # noqa: E402
from benchmarks.kit.pages import cpu_model  # noqa: E402
from benchmarks.kit.peers import HAVE_OPACUS, nonprivate_step, opacus_ghost_step  # noqa: E402
from dprc_core import PrivacyEngine  # noqa: E402
from dprc_core.clipping import Clipping, norm_from_method  # noqa: E402
from dprc_core.losses import causal_lm_per_sample_loss  # noqa: E402
from dprc_core.noise import Gaussian  # noqa: E402

if HAVE_OPACUS:  # imported in every process so that absolute peak RSS stays comparable
    warnings.filterwarnings("ignore", module="opacus")
    import opacus  # noqa: F401, E402

# ---------------------------------------------------------------------------------- settings
MODEL_KW: dict[str, Any] = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)
BATCH = 2
K = 32
MAX_GRAD_NORM = 1.0
NOISE_MULTIPLIER = 1.0
LR = 1e-3
SEQ_LENS = (512, 1024, 2048)
# Timed rounds per T after the warm-up step (full run): at least MIN_REPS, then more while the
# T's time budget (seconds, warm-up excluded) lasts, up to MAX_REPS. Other load on a shared
# machine only adds time, so more rounds make the medians steadier.
MIN_REPS = 7
MAX_REPS = 15
BUDGET_S = {512: 30.0, 1024: 45.0, 2048: 150.0}
MEM_REPS = {2048: 3}  # fresh processes per (config, T) for the default-allocator peak; else 1
LIVE_SEQ_LENS = (2048,)  # T with an extra fixed-mmap-threshold ("live") process per config
LIVE_MMAP_THRESHOLD = 131072
QUICK_SEQ_LENS = (128,)
QUICK_REPS = 2
TARGET_T = 2048
TARGET_TIME = 1.6
TARGET_RSS = 1.05
OPACUS_REFERENCE = "3.8× time and 1.32× peak RSS at T=2048 on a 2-core CPU (from the issue)"
CACHE = ROOT / ".bench" / "llama-4x256-i688-v4096"
BASELINE = "nonprivate"
OPACUS = "opacus-ghost"
DPRC_CONFIGS = tuple(
    f"{method}/{mode}"
    for method in ("exact", "hutch", "hutchpp")
    for mode in ("two_pass", "bookkeeping")
)
ALL_CONFIGS = (BASELINE, *DPRC_CONFIGS, OPACUS)
METHODS_USED: dict[str, dict[str, str]] = {}
FIRST_STEP_NOTE = (
    "The first step of an engine also runs the per-sample independence check: its peak "
    "against a steady step's, with and without the check, at T = 2048 and 8192, is in "
    "[first_step.md](first_step.md) (`benchmarks/first_step.py`)."
)  # config -> parameter -> norm method of last step


# ---------------------------------------------------------------------------------- model
def model_dir() -> Path:
    """Build the model once (seed 0) and save it; later calls reuse the saved checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg_file = CACHE / "config.json"
    if cfg_file.exists() and (CACHE / "model.safetensors").exists():
        saved = json.loads(cfg_file.read_text())
        if all(saved.get(k) == v for k, v in MODEL_KW.items()):
            return CACHE
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**MODEL_KW))
    CACHE.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(CACHE)
    return CACHE


def load_model(path: Path, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = LlamaForCausalLM.from_pretrained(
        path, use_safetensors=True, trust_remote_code=False, dtype=torch.float32
    )
    return model.to(device).train()


def make_batch(seq_len: int, device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234 + seq_len)
    ids = torch.randint(0, MODEL_KW["vocab_size"], (BATCH, seq_len), generator=gen)
    ids = ids.to(device)
    return {"input_ids": ids, "labels": ids}


# ---------------------------------------------------------------------------------- steps
def make_step(
    config: str, path: Path, batch: dict[str, torch.Tensor], device: torch.device
) -> Callable[[], None]:
    """Build a fresh model copy, its optimizer and privacy machinery; return one training step."""
    model = load_model(path, device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if config == BASELINE:
        return nonprivate_step(model, opt, batch)
    if config in DPRC_CONFIGS:
        method, mode = config.split("/")
        engine = PrivacyEngine(
            model,
            opt,
            clipping=Clipping(MAX_GRAD_NORM, norm_from_method(method, k=K), clipped_sum=mode),
            noise=Gaussian(NOISE_MULTIPLIER),
            expected_batch_size=BATCH,
            seed=0,
        )

        def dp_step() -> None:
            stats = engine.step(causal_lm_per_sample_loss, batch)
            METHODS_USED[config] = stats.methods

        return dp_step
    if config == OPACUS:
        return opacus_ghost_step(model, opt, batch, NOISE_MULTIPLIER, MAX_GRAD_NORM)[0]
    raise ValueError(f"unknown configuration {config!r}; expected one of {ALL_CONFIGS}")


def check_opacus_norms(seq_len: int, device: torch.device) -> str:
    """Fairness check: Opacus ghost and dprc exact per-sample norms on the same batch."""
    from dprc_core import per_sample_grad_norms

    try:
        path = model_dir()
        batch = make_batch(seq_len, device)
        ours = per_sample_grad_norms(
            load_model(path, device), causal_lm_per_sample_loss, batch, method="exact"
        )
        model = load_model(path, device)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        step, gsm = opacus_ghost_step(model, opt, batch, NOISE_MULTIPLIER, MAX_GRAD_NORM)
        step()
        theirs = gsm.per_sample_gradient_norms.to(ours.device)
    except Exception as exc:
        return f"norm check failed: {_short_error(exc)}"
    ok = torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    fmt = ", ".join
    return (
        f"per-sample norms at T={seq_len} {'match' if ok else 'DIFFER from'} dprc `exact` "
        f"(Opacus {fmt(f'{x:.5f}' for x in theirs.tolist())}; dprc "
        f"{fmt(f'{x:.5f}' for x in ours.tolist())})."
    )


def measure_one(config: str, seq_len: int, device: torch.device) -> dict[str, Any]:
    """In a fresh process: peak memory of the first step once model and inputs exist (MiB)."""
    path = model_dir()
    batch = make_batch(seq_len, device)
    step = make_step(config, path, batch, device)
    gc.collect()
    sync(device)
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        elapsed = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(device)
        return {"base_mib": base / 2**20, "peak_mib": peak / 2**20, "first_step_s": elapsed}
    base = status_kib("VmRSS")
    reset_peak_checked()
    t0 = time.perf_counter()
    step()
    elapsed = time.perf_counter() - t0
    peak = status_kib("VmHWM")
    return {"base_mib": base / 1024, "peak_mib": peak / 1024, "first_step_s": elapsed}


def measure_in_subprocess(
    config: str, seq_len: int, device: torch.device, live: bool = False
) -> dict[str, Any]:
    """Run ``--one`` in a fresh process; ``live``: with a fixed glibc mmap threshold."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        config,
        str(seq_len),
        "--device",
        str(device),
        "--threads",
        str(torch.get_num_threads()),
    ]
    env = dict(os.environ)
    if live:
        env["MALLOC_MMAP_THRESHOLD_"] = str(LIVE_MMAP_THRESHOLD)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------- timing
@dataclass
class Result:
    config: str
    seq_len: int
    times: list[float] = field(default_factory=list)  # wall seconds per step
    error: str | None = None
    mem: list[dict[str, Any]] = field(default_factory=list)  # one per fresh process
    live: dict[str, Any] | None = None  # fixed mmap threshold (CPU), one fresh process
    methods: str = ""  # dprc: norm methods chosen, with parameter counts

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    def peaks(self) -> list[float]:
        return [m["peak_mib"] for m in self.mem if "peak_mib" in m]

    def peak(self) -> float:
        """Median peak over the fresh processes (MiB); nan if none succeeded."""
        return statistics.median(self.peaks()) if self.peaks() else float("nan")

    def delta(self) -> float:
        """Median of (peak − baseline) over the fresh processes (MiB)."""
        d = [m["peak_mib"] - m["base_mib"] for m in self.mem if "peak_mib" in m]
        return statistics.median(d) if d else float("nan")

    def mem_error(self) -> str | None:
        errors = [m["error"] for m in self.mem if "error" in m]
        return errors[0] if errors else None


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
    return text[:160]


def time_configs(
    configs: list[str],
    seq_len: int,
    min_reps: int,
    max_reps: int,
    budget_s: float,
    device: torch.device,
) -> dict[str, Result]:
    """Warm-up step per configuration, then interleaved rounds A B C … in one process.

    Runs ``min_reps`` rounds, then more while ``budget_s`` (from the first timed round) lasts,
    up to ``max_reps``.
    """
    path = model_dir()
    batch = make_batch(seq_len, device)
    results = {c: Result(c, seq_len) for c in configs}
    steps: dict[str, Callable[[], None]] = {}
    for c in configs:
        try:
            steps[c] = make_step(c, path, batch, device)
            steps[c]()  # warm-up
            sync(device)
            if c in METHODS_USED:
                counts = Counter(METHODS_USED[c].values())
                results[c].methods = ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))
        except Exception as exc:  # reported in the table, never silently dropped
            results[c].error = f"failed: {_short_error(exc)}"
            steps.pop(c, None)
        gc.collect()
    start = time.perf_counter()
    rep = 0
    while steps and (rep < min_reps or (rep < max_reps and time.perf_counter() - start < budget_s)):
        for c, step in steps.items():
            gc.collect()
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            results[c].times.append(time.perf_counter() - t0)
        rep += 1
        done = ", ".join(f"{c} {results[c].times[-1]:.2f}s" for c in steps)
        print(f"  T={seq_len} round {rep}: {done}", flush=True)
    return results


# ---------------------------------------------------------------------------------- report
def machine_facts(device: torch.device) -> list[str]:
    cpu = cpu_model()
    import transformers

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if HAVE_OPACUS:
        import opacus as _opacus

        versions += f", opacus {_opacus.__version__}"
    facts = [
        f"- CPU: {cpu}; {len(os.sched_getaffinity(0))} usable cores; "
        f"torch threads {torch.get_num_threads()} (interop {torch.get_num_interop_threads()})",
        f"- Python {platform.python_version()}, {versions}",
        f"- load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    if device.type == "cuda":
        facts.append(f"- GPU: {torch.cuda.get_device_name(device)}")
    return facts


def _ratio(x: float, ref: float) -> str:
    if not (x == x and ref == ref) or ref <= 0:  # nan-safe
        return "–"
    return f"{x / ref:.2f}×"


def _live_cells(r: Result, ref: Result | None) -> list[str]:
    if r.live is None:
        return ["–", "–", "–"]
    if "error" in r.live:
        return [r.live["error"], "", ""]
    peak, delta = r.live["peak_mib"], r.live["peak_mib"] - r.live["base_mib"]
    ok = ref is not None and ref.live is not None and "peak_mib" in ref.live
    rpeak = ref.live["peak_mib"] if ok else float("nan")
    rdelta = ref.live["peak_mib"] - ref.live["base_mib"] if ok else float("nan")
    return [f"{peak:.0f}", _ratio(peak, rpeak), _ratio(delta, rdelta)]


def render(results: list[Result], device: torch.device) -> list[str]:
    mem_label = "peak RSS MiB" if device.type == "cpu" else "max allocated MiB"
    lines = [
        f"| config | T | n | median s (min–max) | time × NP | {mem_label} [min–max] (m) "
        "| × NP | step Δ MiB | Δ × NP | live peak MiB | live × NP | live Δ × NP |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r.seq_len: r for r in results if r.config == BASELINE}
    for r in results:
        ref = base.get(r.seq_len)
        if r.error:
            lines.append(f"| {r.config} | {r.seq_len} | 0 | {r.error} |" + " |" * 8)
            continue
        t = f"{r.median:.3f} ({min(r.times):.2f}–{max(r.times):.2f})"
        tr = _ratio(r.median, ref.median) if ref else "–"
        peaks = r.peaks()
        if not peaks:
            mem = [r.mem_error() or "not measured", "", "", ""]
        else:
            spread = f" [{min(peaks):.0f}–{max(peaks):.0f}]" if len(peaks) > 1 else ""
            mem = [
                f"{r.peak():.0f}{spread} ({len(peaks)})",
                _ratio(r.peak(), ref.peak() if ref else float("nan")),
                f"{r.delta():.0f}",
                _ratio(r.delta(), ref.delta() if ref else float("nan")),
            ]
        cells = [r.config, str(r.seq_len), str(len(r.times)), t, tr, *mem, *_live_cells(r, ref)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdict(results: list[Result]) -> tuple[str, str]:
    """PASS/FAIL for hutch k=32 at T=2048 (best clipping mode) and the mode it refers to."""
    by = {(r.config, r.seq_len): r for r in results}
    ref = by.get((BASELINE, TARGET_T))
    if ref is None or ref.error or not ref.peaks():
        return "NOT MEASURED", f"this run has no non-private step at T={TARGET_T}"
    scored = []
    for mode in ("two_pass", "bookkeeping"):
        r = by.get((f"hutch/{mode}", TARGET_T))
        if r is None or r.error or not r.peaks():
            continue
        tr, mr = r.median / ref.median, r.peak() / ref.peak()
        live = f"; min/min time {min(r.times) / min(ref.times):.2f}×"
        if r.live and ref.live and "peak_mib" in r.live and "peak_mib" in ref.live:
            live += f"; live peak {r.live['peak_mib'] / ref.live['peak_mib']:.2f}×"
        scored.append((max(tr / TARGET_TIME, mr / TARGET_RSS), mode, tr, mr, live))
    if not scored:
        return "FAIL", "hutch not measured"
    score, mode, tr, mr, live = min(scored)
    status = "PASS" if score <= 1.0 else "FAIL"
    return status, (
        f"best mode `{mode}`: {tr:.2f}× time (target ≤ {TARGET_TIME}×), "
        f"{mr:.2f}× peak RSS (target ≤ {TARGET_RSS}×){live}"
    )


def methods_lines(results: list[Result]) -> list[str]:
    """One line per (norm method, T): what dprc chose per parameter (same for both modes)."""
    seen: dict[tuple[str, int], str] = {}
    for r in results:
        if r.methods:
            seen.setdefault((r.config.split("/")[0], r.seq_len), r.methods)
    return [f"- `{m}` at T={t}: {what}" for (m, t), what in seen.items()]


def write_doc(
    path: Path,
    cmd: str,
    facts: list[str],
    table: list[str],
    verdict_line: str,
    device: torch.device,
    opacus_note: str,
    wall_s: float,
    methods: list[str],
) -> None:
    mem_how = (
        "peak RSS (`VmHWM` after `echo 5 > /proc/self/clear_refs`) of the first step in a fresh "
        "process, reset once the model, optimizer, engine and batch exist; median over m fresh "
        "processes (glibc's default allocator makes this peak vary by up to ~15% between "
        "identical processes); step Δ = peak − RSS just before the step. *Live* columns: one "
        f"more fresh process with `MALLOC_MMAP_THRESHOLD_={LIVE_MMAP_THRESHOLD}`, so that every "
        "tensor of 128 KiB or more is its own mapping, returned to the OS when freed: that "
        "peak follows the live tensors (repeatable to < 1 MiB) and shows how much of the "
        "default RSS difference is allocator fragmentation rather than memory dprc holds"
        if device.type == "cpu"
        else "`torch.cuda.max_memory_allocated` of the first step in a fresh process per row; "
        "step Δ = peak − `memory_allocated` just before the step"
    )
    text = [
        "## One training step: dprc vs non-private vs Opacus ghost (`benchmarks/step.py`)",
        "",
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} by `{cmd}` "
        f"({wall_s / 60:.1f} min, device `{device}`).",
        "",
        *facts,
        "",
        "Settings: Llama, 4 layers, hidden 256, intermediate 688, 8 heads / 4 KV heads, vocab "
        "4096, untied embeddings, float32, default (sdpa) attention, `model.train()`, loaded "
        "with `from_pretrained(..., use_safetensors=True)`; "
        f"B = {BATCH}, random tokens, labels = inputs; SGD lr {LR}; C = {MAX_GRAD_NORM}, "
        f"σ = {NOISE_MULTIPLIER}, k = {K}, expected batch size {BATCH}. "
        "Per-sample loss = mean next-token cross-entropy of each sequence (same loss values "
        "everywhere; the non-private step uses its mean). Norm methods dprc used (number of "
        "parameters; 1-D parameters are always exact, embeddings sparse-row fgc):",
        "",
        *methods,
        "",
        "Time: one warm-up step per configuration, then n rounds interleaved A B C … in one "
        "process (one model copy per configuration, same weights; n in the table); median "
        "and (min–max) wall time of `step()`; NP = the non-private median of the same run. "
        f"Memory: {mem_how}.",
        "",
        *table,
        "",
        f"**Target** (dprc hutch k=32 at T={TARGET_T} within {TARGET_TIME}× non-private time "
        f"and {TARGET_RSS}× its peak RSS): **{verdict_line}**",
        "",
        f"Opacus: {opacus_note} Reference: {OPACUS_REFERENCE}.",
        "",
        FIRST_STEP_NOTE,
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text))


# ---------------------------------------------------------------------------------- profile
def profile(config: str, seq_len: int, device: torch.device) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step = make_step(config, model_dir(), make_batch(seq_len, device), device)
    step()  # warm-up
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch_profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
        step()
        sync(device)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    print(
        prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=30
        )
    )


# ---------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: T=128, 2 rounds")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--configs", nargs="+", default=None, help=f"subset of {', '.join(ALL_CONFIGS)}"
    )
    parser.add_argument("--seq-lens", nargs="+", type=int, default=None)
    parser.add_argument(
        "--reps", type=int, default=None, help="exactly this many timed rounds for every T"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown output (full run default: docs/benchmarks/step.md, "
        "or docs/benchmarks/step_cuda.md with --device cuda)",
    )
    parser.add_argument(
        "--mem-reps",
        type=int,
        default=None,
        help=f"fresh processes per (config, T) for peak memory (default {MEM_REPS}, else 1)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)"
    )
    parser.add_argument(
        "--one",
        nargs=2,
        metavar=("CONFIG", "T"),
        help="internal: memory of one step in this (fresh) process, as JSON",
    )
    parser.add_argument(
        "--profile",
        nargs=2,
        metavar=("CONFIG", "T"),
        help="print a torch.profiler table of one step",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), device)), flush=True)
        return 0
    if args.profile:
        profile(args.profile[0], int(args.profile[1]), device)
        return 0

    t_start = time.perf_counter()
    configs = list(args.configs or ALL_CONFIGS)
    if BASELINE not in configs:
        configs.insert(0, BASELINE)
    opacus_note = (
        'installed; `make_private(..., grad_sample_mode="ghost", poisson_sampling=False)` '
        "on the same HF model (ghost norms for Linear and Embedding; Opacus has no sampler "
        "for `LlamaRMSNorm` and uses its functorch fallback there), loss via its ghost "
        "criterion wrapper (`CrossEntropyLoss`, `shape=(B, T-1)`), SGD."
    )
    if OPACUS in configs and not HAVE_OPACUS:
        configs.remove(OPACUS)
        opacus_note = "not installed (`pip install 'dprc[bench]'`); not measured."
    seq_lens = tuple(args.seq_lens or (QUICK_SEQ_LENS if args.quick else SEQ_LENS))
    out = args.out
    if out is None and not args.quick:
        name = "step.md" if device.type == "cpu" else "step_cuda.md"
        out = ROOT / "docs" / "benchmarks" / name
    facts = machine_facts(device)
    print("\n".join(facts), flush=True)
    model_dir()
    if OPACUS in configs:
        check = check_opacus_norms(QUICK_SEQ_LENS[0], device)
        opacus_note += " Fairness check: " + check
        print("Opacus " + check, flush=True)

    results: list[Result] = []
    for t in seq_lens:
        if args.reps or args.quick:
            lo = hi = args.reps or QUICK_REPS
            budget = 0.0
        else:
            lo, hi, budget = MIN_REPS, MAX_REPS, BUDGET_S.get(t, 120.0)
        print(
            f"timing T={t} ({lo}–{hi} interleaved rounds after warm-up, budget {budget:.0f}s) …",
            flush=True,
        )
        timed = time_configs(configs, t, lo, hi, budget, device)
        results.extend(timed[c] for c in configs)
    for r in results:
        if r.error:
            continue
        n = args.mem_reps or (
            1 if args.quick or device.type == "cuda" else MEM_REPS.get(r.seq_len, 1)
        )
        live = device.type == "cpu" and (args.quick or r.seq_len in LIVE_SEQ_LENS)
        print(
            f"memory {r.config} T={r.seq_len}: {n} fresh process(es)"
            f"{' + 1 live' if live else ''} …",
            flush=True,
        )
        r.mem = [measure_in_subprocess(r.config, r.seq_len, device) for _ in range(n)]
        if live:
            r.live = measure_in_subprocess(r.config, r.seq_len, device, live=True)

    opacus_errors = {r.error for r in results if r.config == OPACUS and r.error}
    if opacus_errors:
        opacus_note += " The ghost step " + "; ".join(sorted(opacus_errors)) + "."
    table = render(results, device)
    status, detail = verdict(results)
    verdict_line = f"{status}: {detail}"
    wall = time.perf_counter() - t_start
    facts.append(f"- load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(["", *table, "", f"Target: {verdict_line}", f"wall {wall / 60:.1f} min"]))
    if out is not None:
        cmd = " ".join([".venv/bin/python", "benchmarks/step.py", *(argv or sys.argv[1:])])
        write_doc(
            out, cmd, facts, table, verdict_line, device, opacus_note, wall, methods_lines(results)
        )
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
