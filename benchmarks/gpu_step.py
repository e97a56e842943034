"""The device run of scripts/gpu_check.sh: a ~0.85B Llama's step and the norm pass, on one GPU.

Issue 32. Every other figure of docs/benchmarks/ comes from 2 CPU cores and models of at most
~118M parameters; this script measures the paper's claim where it is made, on a GPU, within a
fixed budget (the device is lent for minutes, once in a while). It has three entry points, one
per section of ``scripts/gpu_check.sh``, each run under its own ``timeout`` by that script:

* ``--plan``: prints the plan and its time estimate for the whole script *before* anything runs
  (per section and in total) and the ``timeout`` of each section. The estimate is a simple
  model: per cell, ``6·N·tokens`` FLOPs (``4·N·tokens`` with LoRA: no weight gradients of the
  frozen base) plus attention's ``12·L·h·T²·B`` at an assumed, conservative throughput, times a
  cost factor per mode, plus a fixed overhead per cell (build the model, free it). When the
  estimate exceeds the 8-minute budget the plan drops whole (variant, T, B) groups in a fixed
  order (``DROP_ORDER``) and says which.
* ``--section step``: random-weight Llama models built from a ``LlamaConfig`` (nothing is
  downloaded): hidden 2048, 16 layers, 32 heads / 8 KV heads, intermediate 5632, vocab 32000,
  bf16; full fine-tuning and LoRA (peft, r = 16, every linear layer of the blocks); T ∈ {2048,
  8192}, B ∈ {1, 4}; modes non-private, dprc exact, dprc hutch k = 32 (per-example sketch),
  dprc auto and Opacus ghost clipping (a note, not a crash, when opacus is not installed).
  Each cell builds a fresh model (seed 0) and runs step 1 — the engine's per-sample
  independence check runs inside it — then ``reps`` timed steps: the step time is their
  median, the steady peak their largest ``torch.cuda.max_memory_allocated`` (reset before
  each), the first-step peak step 1's. ``torch.cuda.OutOfMemoryError`` is a result ("OOM"):
  the cell's memory is freed and the next cell runs. A wall-clock guard skips the remaining
  cells ("skipped: time budget") when the section's share of the budget would be exceeded;
  cells the plan dropped run afterwards only if the guard still allows them.
* ``--section norm``: the norm pass alone for the paper's layer (8192 × 2048 linear, B = 2,
  T = 4096, float32; benchmarks/norm_layer.py's inputs and runner): extra memory and time of
  hutch k = 32 against exact, in one process (``max_memory_allocated`` is exact on CUDA, so
  no fresh process per method is needed, unlike the RSS-based CPU page).

Every section updates ``$OUT/gpu.json`` (the raw figures) and rewrites ``$OUT/gpu.md`` from it
after each cell, so that a section killed by its timeout still leaves the cells it finished.

``--dry-run`` runs the same code paths at toy sizes on the CPU (a 2-layer Llama, T ∈ {16, 32},
B ∈ {1, 2}, bf16), with two test hooks switched on: an out-of-memory error injected into one
cell (``--inject-oom``) and the guard's clock pushed past the deadline before the last cells
(``--exhaust-after``). The plan it prints is the device run's. tests/test_gpu_check_dry_run.py
runs ``bash scripts/gpu_check.sh --dry-run`` in the suite, so that the script cannot rot
between loans.

Usage::

    bash scripts/gpu_check.sh                   # on the GPU machine: all sections, in $OUT
    bash scripts/gpu_check.sh --dry-run         # on a CPU: the toy version, in $OUT
    python benchmarks/gpu_step.py --plan [--dry-run]
    python benchmarks/gpu_step.py --section step --out DIR [--dry-run]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.kit.device import Memory, sync  # noqa: E402
from benchmarks.kit.pages import git_commit  # noqa: E402
from benchmarks.kit.peers import HAVE_OPACUS, nonprivate_step, opacus_ghost_step  # noqa: E402

STARTED = time.monotonic()  # the section's clock starts when its process does

# ---------------------------------------------------------------------------------- settings
BUDGET_S = 480.0  # the whole of scripts/gpu_check.sh on the device: 8 minutes
DEVICE_MODEL: dict[str, Any] = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
)
DRY_MODEL: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
VARIANTS = ("full", "lora")
SEQ_LENS = (2048, 8192)
BATCHES = (1, 4)
MODES = ("nonprivate", "exact", "hutch", "auto", "opacus")
MODE_LABELS = {
    "nonprivate": "non-private",
    "exact": "dprc exact",
    "hutch": "dprc hutch k=32",
    "auto": "dprc auto",
    "opacus": "Opacus ghost",
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
K = 32
MAX_GRAD_NORM = 1.0
NOISE_MULTIPLIER = 1.0
LR = 1e-3
FIRST_STEP_TARGET = 1.05  # benchmarks/first_step.py's target: first ÷ steady peak

# The estimate's model (device run). Conservative on purpose: an H200 reaches several times this
# throughput in bf16; DP modes pay for per-sample norms (exact: per-sample gradients or T²
# ghost norms; Opacus: a second backward); step 1 of dprc also runs the independence check.
THROUGHPUT_FLOPS = 100e12
MODE_COST = {"nonprivate": 1.0, "exact": 2.5, "hutch": 1.5, "auto": 1.5, "opacus": 3.0}
FIRST_STEP_COST = {"nonprivate": 1.0, "exact": 2.0, "hutch": 2.0, "auto": 2.0, "opacus": 1.0}
CELL_OVERHEAD_S = 4.0  # build a fresh model (and its adapters, engine), free it afterwards
STEP_STARTUP_S = 20.0  # the step section's imports, CUDA context, cuBLAS handles
# The other sections: (estimate s, timeout s); the step section gets what the budget leaves.
SECTIONS: dict[str, tuple[float, int]] = {
    "plan": (10.0, 60),  # this process: imports torch, counts GPUs
    "norm": (30.0, 60),
    "tests": (90.0, 130),
    "distributed": (60.0, 90),
}
MARGIN_S = 15.0  # slack between sections (shell, process start-up)
STEP_TIMEOUT_GRACE_S = 20  # the step section's timeout = its share + this (the guard stops first)
DRY_TIMEOUTS = {"step": 240, "norm": 90}
# When the estimate exceeds the budget, whole (variant, T, B) groups are dropped in this order:
# first the short-context large batches (the same tokens as T = 8192, B = 1, and less of the
# question "does long context fit"), then the rest; (full, 8192, 1) is never dropped.
DROP_ORDER: tuple[tuple[str, int, int], ...] = (
    ("lora", 2048, 4),
    ("full", 2048, 4),
    ("lora", 8192, 4),
    ("lora", 2048, 1),
    ("full", 8192, 4),
    ("full", 2048, 1),
    ("lora", 8192, 1),
)
DROPPED = "dropped: over the plan's budget"
SKIPPED = "skipped: time budget"
NO_OPACUS = "opacus not installed"
NOT_REACHED = "not reached: the section ended first"


@dataclass(frozen=True)
class Scale:
    """The sizes one run uses: the device's, or the dry run's toy stand-ins for them."""

    name: str  # "device" | "dry"
    device: str
    dtype: torch.dtype
    model: dict[str, Any]  # LlamaConfig keywords
    seq: dict[int, int]  # the plan's T -> the T this run uses
    batch: dict[int, int]  # the plan's B -> the B this run uses
    lora_r: int
    reps: int  # timed steps after step 1
    norm_shape: tuple[int, int]  # (p, d): weight out × in
    norm_seq: int
    norm_batch: int
    norm_reps: int


DEVICE = Scale(
    name="device",
    device="cuda",
    dtype=torch.bfloat16,
    model=DEVICE_MODEL,
    seq={t: t for t in SEQ_LENS},
    batch={b: b for b in BATCHES},
    lora_r=16,
    reps=3,
    norm_shape=(8192, 2048),
    norm_seq=4096,
    norm_batch=2,
    norm_reps=10,
)
DRY = Scale(
    name="dry",
    device="cpu",
    dtype=torch.bfloat16,
    model=DRY_MODEL,
    seq={2048: 16, 8192: 32},
    batch={1: 1, 4: 2},
    lora_r=4,
    reps=2,
    norm_shape=(1024, 512),
    norm_seq=256,
    norm_batch=2,
    norm_reps=3,
)


@dataclass(frozen=True)
class Cell:
    """One (variant, T, B, mode) of the step benchmark, in the plan's (device) sizes."""

    variant: str
    seq_len: int
    batch: int
    mode: str

    @property
    def key(self) -> str:
        return f"{self.variant}/T{self.seq_len}/B{self.batch}/{self.mode}"

    @property
    def group(self) -> tuple[str, int, int]:
        return (self.variant, self.seq_len, self.batch)


def all_cells() -> list[Cell]:
    """Every cell, in the order they run and are listed."""
    return [Cell(v, t, b, m) for v in VARIANTS for t in SEQ_LENS for b in BATCHES for m in MODES]


# ---------------------------------------------------------------------------------- estimate
def llama_params(cfg: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, those in matrix products: the blocks' linears and the LM head)."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = h * cfg["num_key_value_heads"] // cfg["num_attention_heads"]
    block = 2 * h * h + 2 * h * kv + 3 * h * i
    layers = cfg["num_hidden_layers"]
    matmul = layers * block + v * h
    return matmul + v * h + (2 * layers + 1) * h, matmul


def step_flops(cell: Cell, cfg: dict[str, Any]) -> float:
    """Training FLOPs of one non-private step: 6·N·tokens (4·N with LoRA) + attention."""
    _, matmul = llama_params(cfg)
    tokens = cell.seq_len * cell.batch
    per_token = 6 if cell.variant == "full" else 4
    attention = 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * cell.seq_len**2 * cell.batch
    return per_token * matmul * tokens + attention


def cell_estimate(cell: Cell, scale: Scale, have_opacus: bool) -> float:
    """Seconds the device needs for the cell by the plan's model (0 for a note-only cell)."""
    if cell.mode == "opacus" and not have_opacus:
        return 0.0
    step_s = step_flops(cell, DEVICE_MODEL) / THROUGHPUT_FLOPS * MODE_COST[cell.mode]
    steps = FIRST_STEP_COST[cell.mode] + scale.reps
    return CELL_OVERHEAD_S + steps * step_s


# ---------------------------------------------------------------------------------- plan
@dataclass
class Plan:
    """Which cells run, which the budget drops, and every section's estimate and timeout."""

    planned: list[Cell]
    dropped: list[Cell]
    estimates: dict[str, float]  # cell key -> seconds
    step_share_s: float  # what the budget leaves the step section
    dropped_groups: list[tuple[str, int, int]] = field(default_factory=list)

    def step_estimate(self) -> float:
        return STEP_STARTUP_S + sum(self.estimates[c.key] for c in self.planned)

    def total_estimate(self) -> float:
        return sum(est for est, _ in SECTIONS.values()) + MARGIN_S + self.step_estimate()

    def timeouts(self) -> dict[str, int]:
        out = {name: limit for name, (_, limit) in SECTIONS.items() if name != "plan"}
        out["step"] = int(self.step_share_s) + STEP_TIMEOUT_GRACE_S
        return out


def make_plan(have_opacus: bool = HAVE_OPACUS) -> Plan:
    """The device run's plan: every cell, less whole groups in DROP_ORDER until it fits."""
    cells = all_cells()
    estimates = {c.key: cell_estimate(c, DEVICE, have_opacus) for c in cells}
    share = BUDGET_S - sum(est for est, _ in SECTIONS.values()) - MARGIN_S
    plan = Plan(cells, [], estimates, share)
    for group in DROP_ORDER:
        if plan.step_estimate() <= share:
            break
        plan.dropped += [c for c in plan.planned if c.group == group]
        plan.planned = [c for c in plan.planned if c.group != group]
        plan.dropped_groups.append(group)
    return plan


def model_label(cfg: dict[str, Any]) -> str:
    return (
        f"hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads, "
        f"intermediate {cfg['intermediate_size']}, vocab {cfg['vocab_size']}"
    )


def _group_label(group: tuple[str, int, int]) -> str:
    variant, t, b = group
    return f"{variant} T={t} B={b}"


def plan_lines(plan: Plan, dry: bool, gpus: int) -> list[str]:
    """The plan as printed before anything runs: assumptions, groups, sections, total."""
    total, params = plan.total_estimate(), llama_params(DEVICE_MODEL)[0]
    head = (
        "dry run: toy sizes on the CPU; the estimate is the device run's" if dry else "device run"
    )
    lines = [
        f"plan ({head}; {gpus} GPU(s)); budget {BUDGET_S:.0f} s ({BUDGET_S / 60:.1f} min)",
        f"  model: Llama {params_label(params)} parameters ({model_label(DEVICE_MODEL)}), bf16, "
        f"random weights; LoRA r = {DEVICE.lora_r}",
        f"  estimate model: {THROUGHPUT_FLOPS / 1e12:.0f} TFLOP/s, 6·N·tokens (4·N LoRA) + "
        f"attention 12·L·h·T²·B; mode cost × non-private: "
        + ", ".join(f"{m} {c}" for m, c in MODE_COST.items())
        + f"; {CELL_OVERHEAD_S:.0f} s per cell; step 1 + {DEVICE.reps} timed steps",
    ]
    if not HAVE_OPACUS:
        lines.append(f"  opacus: not installed; its cells read '{NO_OPACUS}' (0 s)")
    for group in dict.fromkeys(c.group for c in all_cells()):
        cells = [c for c in all_cells() if c.group == group]
        est = sum(plan.estimates[c.key] for c in cells)
        state = "DROPPED (over budget)" if group in plan.dropped_groups else "planned"
        lines.append(f"  step {_group_label(group)}: {len(cells)} cells, est {est:.0f} s, {state}")
    dropped = ", ".join(map(_group_label, plan.dropped_groups)) or "none"
    measured = sum(1 for c in plan.planned if plan.estimates[c.key] > 0)
    lines += [
        f"  section step: {len(plan.planned)} cells ({measured} to measure), est "
        f"{plan.step_estimate():.0f} s "
        f"(share {plan.step_share_s:.0f} s); dropped by the plan: {dropped} (run at the end "
        "only while the wall-clock guard still allows)",
        *(f"  section {n}: est {est:.0f} s" for n, (est, _) in SECTIONS.items()),
        f"  margin: {MARGIN_S:.0f} s",
        f"total estimate: {total:.0f} s ({total / 60:.1f} min), budget {BUDGET_S:.0f} s "
        f"({BUDGET_S / 60:.1f} min): {'fits' if total <= BUDGET_S else 'OVER BUDGET'}",
    ]
    timeouts = DRY_TIMEOUTS if dry else plan.timeouts()
    lines.append(
        f"timeouts: gpus={gpus} " + " ".join(f"{n}={s}" for n, s in sorted(timeouts.items()))
    )
    return lines


# ---------------------------------------------------------------------------------- device
def free_memory(device: torch.device) -> None:
    """Collect the cell's objects (hooks make cycles) and return CUDA's cached blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def is_oom(exc: BaseException) -> bool:
    """CUDA's allocator error, or a library's allocation failure reported as RuntimeError."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return "out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
    return text[:200]


# ---------------------------------------------------------------------------------- steps
def build_model(variant: str, scale: Scale, device: torch.device) -> torch.nn.Module:
    """A fresh random-weight Llama (seed 0) on the device in the scale's dtype; LoRA adapters
    on every linear layer of the blocks for ``variant == "lora"``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model: torch.nn.Module = LlamaForCausalLM(LlamaConfig(**scale.model, use_cache=False))
    model = model.to(scale.dtype).train()
    if variant == "lora":
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=scale.lora_r,
            lora_alpha=2 * scale.lora_r,
            target_modules=LORA_TARGETS,
            lora_dropout=0.0,
        )
        model = get_peft_model(model, cfg)
    return model


def make_batch(seq_len: int, batch: int, vocab: int, device: torch.device) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1234 + seq_len)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    return {"input_ids": ids, "labels": ids}


def _dprc_step(
    mode: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: dict[str, Any],
    methods: Counter[str],
) -> Callable[[], None]:
    """dprc's step with the library's defaults (book-keeping clipped sums, the independence
    check on step 1, per-example sketches for the randomized methods); ``methods`` receives
    the norm method each parameter used."""
    from dprc_core import PrivacyEngine
    from dprc_core.clipping import Clipping, norm_from_method
    from dprc_core.losses import causal_lm_per_sample_loss
    from dprc_core.noise import Gaussian

    b, t = batch["input_ids"].shape
    norm = norm_from_method(mode, k=K, max_seq_len=t)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(MAX_GRAD_NORM, norm),
        noise=Gaussian(NOISE_MULTIPLIER),
        expected_batch_size=b,
        seed=0,
    )

    def step() -> None:
        stats = engine.step(causal_lm_per_sample_loss, batch)
        methods.clear()
        methods.update(stats.methods.values())

    return step


def make_step(
    cell: Cell, scale: Scale, device: torch.device, methods: Counter[str]
) -> Callable[[], None]:
    """A fresh model, its optimizer (SGD: no state, so memory is the step's) and batch, and
    the cell's training step over them."""
    model = build_model(cell.variant, scale, device)
    seq_len, batch_size = scale.seq[cell.seq_len], scale.batch[cell.batch]
    batch = make_batch(seq_len, batch_size, scale.model["vocab_size"], device)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    if cell.mode == "nonprivate":
        return nonprivate_step(model, opt, batch)
    if cell.mode == "opacus":
        return opacus_ghost_step(model, opt, batch, NOISE_MULTIPLIER, MAX_GRAD_NORM)[0]
    return _dprc_step(cell.mode, model, opt, batch, methods)


def _injected_oom() -> None:
    raise torch.cuda.OutOfMemoryError(
        "CUDA out of memory (injected by --inject-oom: the dry run's test of the OOM path)"
    )


def measure_cell(
    cell: Cell, scale: Scale, device: torch.device, inject_oom: bool
) -> dict[str, Any]:
    """Step 1 (first-step peak and time), then ``scale.reps`` timed steps (median time,
    steady peak = the largest of theirs)."""
    methods: Counter[str] = Counter()
    step = make_step(cell, scale, device, methods)
    if inject_oom:
        step = _injected_oom
    memory = Memory(device)
    base = memory.used_mib()
    memory.reset()
    t0 = time.perf_counter()
    step()
    sync(device)
    first_s, first_peak = time.perf_counter() - t0, memory.peak_mib()
    times, steady = [], 0.0
    for _ in range(scale.reps):
        memory.reset()
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
        steady = max(steady, memory.peak_mib())
    median = statistics.median(times)
    tokens = scale.seq[cell.seq_len] * scale.batch[cell.batch]
    return {
        "step_s": median,
        "times_s": times,
        "tokens_per_s": tokens / median if median > 0 else None,
        "first_s": first_s,
        "base_mib": base,
        "first_peak_mib": first_peak,
        "steady_peak_mib": steady,
        "methods": dict(sorted(methods.items())),
    }


def cell_record(cell: Cell, scale: Scale, status: str) -> dict[str, Any]:
    """The cell's entry in gpu.json before (or instead of) a measurement."""
    return {
        "key": cell.key,
        "variant": cell.variant,
        "mode": cell.mode,
        "plan_T": cell.seq_len,
        "plan_B": cell.batch,
        "T": scale.seq[cell.seq_len],
        "B": scale.batch[cell.batch],
        "status": status,
    }


def run_cell(cell: Cell, scale: Scale, inject_oom: bool) -> dict[str, Any]:
    """Measure one cell; an OOM (or any failure) becomes the cell's status and the memory
    is freed once the exception, and with it the cell's frames, are gone."""
    device = torch.device(scale.device)
    record = cell_record(cell, scale, "ok")
    try:
        record |= measure_cell(cell, scale, device, inject_oom)
    except Exception as exc:  # every failure is a result of the cell, never the script's end
        record["status"] = "OOM" if is_oom(exc) else f"failed: {short_error(exc)}"
        record["error"] = short_error(exc)
        if device.type == "cuda":
            record["peak_before_oom_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    free_memory(device)
    record["after_free_mib"] = Memory(device).used_mib()
    return record


# ---------------------------------------------------------------------------------- guard
@dataclass
class Guard:
    """The step section's wall-clock guard: a cell runs only if its estimate still fits
    before the deadline. ``exhaust()`` (a test hook) pushes the clock past the deadline."""

    deadline: float  # time.monotonic() seconds
    offset: float = 0.0

    def now(self) -> float:
        return time.monotonic() + self.offset

    def allows(self, estimate_s: float) -> bool:
        return self.now() + estimate_s <= self.deadline

    def exhaust(self) -> None:
        self.offset += max(self.deadline - self.now(), 0.0) + 1.0


@dataclass
class Hooks:
    """Test hooks of the dry run: one cell's step raises an OOM; the guard's clock jumps past
    its deadline before the planned cell with this index (0-based)."""

    inject_oom: str | None = None
    exhaust_after: int | None = None


def dry_hooks(plan: Plan) -> Hooks:
    """The dry run's hooks: an OOM in the first planned dprc exact cell, and the guard out of
    time for the last two planned cells that would run (Opacus's are notes without it)."""
    exact = next(c.key for c in plan.planned if c.mode == "exact")
    runnable = [i for i, c in enumerate(plan.planned) if c.mode != "opacus" or HAVE_OPACUS]
    return Hooks(inject_oom=exact, exhaust_after=runnable[-2])


# ---------------------------------------------------------------------------------- sections
def _describe(record: dict[str, Any], unit: str) -> str:
    if record["status"] != "ok":
        return record["status"]
    div = 1024 if unit == "GiB" else 1
    steady, first = record["steady_peak_mib"] / div, record["first_peak_mib"] / div
    return (
        f"{record['step_s']:.3f} s/step, {record['tokens_per_s']:.0f} tok/s, "
        f"steady peak {steady:.2f} {unit}, first step {first:.2f} {unit}"
    )


def freeze_imports() -> None:
    """Import the libraries every cell uses, then move every object alive into gc's permanent
    generation: transformers alone leaves so many that each ``gc.collect()`` between steps
    would otherwise take a third of a second."""
    try:
        from peft import LoraConfig, get_peft_model  # noqa: F401
        from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401

        from dprc_core import PrivacyEngine  # noqa: F401
        from dprc_core.losses import causal_lm_per_sample_loss  # noqa: F401
    except ImportError:
        pass  # each cell then reports the failed import as its result
    gc.collect()
    gc.freeze()


def _reason_not_to_run(cell: Cell, extra: bool, guard: Guard, plan: Plan) -> str | None:
    """The status a cell gets instead of a measurement, or None when it runs now."""
    if cell.mode == "opacus" and not HAVE_OPACUS:
        return NO_OPACUS
    if not guard.allows(plan.estimates[cell.key]):
        return DROPPED if extra else SKIPPED
    return None


def run_step_section(scale: Scale, plan: Plan, results: Results, hooks: Hooks) -> int:
    """Every planned cell under the guard, then the dropped ones while time is left; exit
    status 1 when a cell failed otherwise than by running out of memory."""
    freeze_imports()
    guard = Guard(STARTED + plan.step_share_s)
    # a cell not reached keeps this status in gpu.json if the section's timeout kills it
    records = {c.key: cell_record(c, scale, NOT_REACHED) for c in all_cells()}
    unit = "GiB" if scale.device == "cuda" else "MiB"
    queue = [(c, False) for c in plan.planned] + [(c, True) for c in plan.dropped]
    for index, (cell, extra) in enumerate(queue):
        if hooks.exhaust_after is not None and index == hooks.exhaust_after:
            print("test hook: the guard's clock is pushed past its deadline", flush=True)
            guard.exhaust()
        reason = _reason_not_to_run(cell, extra, guard, plan)
        if reason is not None:
            records[cell.key]["status"] = reason
            continue
        tag = "extra cell (dropped by the plan; time left)" if extra else "cell"
        sizes = f"T={scale.seq[cell.seq_len]}, B={scale.batch[cell.batch]}"
        est = plan.estimates[cell.key]
        print(
            f"{tag} {index + 1}/{len(queue)}: {cell.key} ({sizes}; est {est:.0f} s) …", flush=True
        )
        records[cell.key] = run_cell(cell, scale, inject_oom=cell.key == hooks.inject_oom)
        print(f"  → {_describe(records[cell.key], unit)}", flush=True)
        results.update("step", step_payload(records, scale, plan))
    payload = step_payload(records, scale, plan)
    results.update("step", payload)
    for line in step_summary(payload):
        print("summary: " + line, flush=True)
    return 1 if any(r["status"].startswith("failed") for r in records.values()) else 0


def step_payload(records: dict[str, dict[str, Any]], scale: Scale, plan: Plan) -> dict[str, Any]:
    return {
        "scale": scale.name,
        "model": dict(scale.model),
        "params": llama_params(scale.model)[0],
        "dtype": str(scale.dtype).removeprefix("torch."),
        "reps": scale.reps,
        "lora_r": scale.lora_r,
        "estimate_s": plan.step_estimate(),
        "share_s": plan.step_share_s,
        "wall_s": time.monotonic() - STARTED,
        "cells": [records[c.key] for c in all_cells()],
    }


def step_summary(payload: dict[str, Any]) -> list[str]:
    """Counts of each status, the section's wall time, and the first-step check's verdict."""
    cells = payload["cells"]
    counts = Counter(
        r["status"] if not r["status"].startswith("failed") else "failed" for r in cells
    )
    lines = [
        "step: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f"; wall {payload['wall_s']:.0f} s (estimate {payload['estimate_s']:.0f} s)"
    ]
    ratios = [
        r["first_peak_mib"] / r["steady_peak_mib"]
        for r in cells
        if r["status"] == "ok" and r["mode"] == "hutch" and r["B"] >= 2 and r["steady_peak_mib"]
    ]
    if ratios:
        verdict = "PASS" if max(ratios) <= FIRST_STEP_TARGET else "FAIL"
        lines.append(
            f"first step: {verdict}: dprc hutch first-step peak ÷ steady peak at most "
            f"{max(ratios):.2f}× (target ≤ {FIRST_STEP_TARGET}×; B ≥ 2, where the check runs)"
        )
    return lines


def run_norm_section(scale: Scale, results: Results) -> int:
    """The norm pass alone on the paper's layer: exact against hutch k = 32 (memory, then
    interleaved timing), with norm_layer.py's inputs, runner and FLOP counts."""
    from benchmarks import norm_layer

    device = torch.device(scale.device)
    (p, d), b, t = scale.norm_shape, scale.norm_batch, scale.norm_seq
    print(f"norm pass: {p}×{d} linear, B={b}, T={t}, float32, {device} …", flush=True)
    a, g = norm_layer.make_inputs(b, t, p, d, device)
    runs = {m: norm_layer.runner(a, g, m, K) for m in ("exact", "hutch")}
    rows: dict[str, dict[str, Any]] = {}
    memory = Memory(device)
    for name, run in runs.items():
        rows[name] = _norm_memory(name, run, memory)
    times: dict[str, list[float]] = {m: [] for m in runs if rows[m]["status"] == "ok"}
    for _ in range(scale.norm_reps):
        for name in times:
            times[name].extend(norm_layer.time_runs(runs[name], device, 1, 0.0))
    for name, row in rows.items():
        if name in times:
            row["time_s"] = statistics.median(times[name])
            flops_method = row["used"] if name == "exact" else name
            row["gflop"] = norm_layer.flops(flops_method, b, t, p, d, K) / 1e9
    payload = {"p": p, "d": d, "B": b, "T": t, "k": K, "reps": scale.norm_reps, "rows": rows}
    results.update("norm", payload)
    for line in norm_summary(payload):
        print("summary: " + line, flush=True)
    return 0 if all(r["status"] in ("ok", "OOM") for r in rows.values()) else 1


def _norm_memory(name: str, run: Callable[[], str], memory: Memory) -> dict[str, Any]:
    """One warm-up run, then the extra memory of one run (peak − memory in use before)."""
    try:
        run()  # warm-up: kernels, workspaces, lazy initialisation
        base = memory.used_mib()
        memory.reset()
        used = run()
        extra = max(memory.peak_mib() - base, 0.0)
    except Exception as exc:
        status = "OOM" if is_oom(exc) else f"failed: {short_error(exc)}"
        return {"status": status}
    finally:
        free_memory(memory.device)
    return {"status": "ok", "used": used, "extra_mib": extra}


def norm_summary(payload: dict[str, Any]) -> list[str]:
    rows = payload["rows"]
    e, h = rows["exact"], rows["hutch"]
    if "time_s" not in e or "time_s" not in h:
        return [f"norm pass: exact {e['status']}, hutch {h['status']}"]
    mem = h["extra_mib"] / e["extra_mib"] if e["extra_mib"] > 0 else float("nan")
    return [
        f"norm pass: hutch k={K} uses {100 * mem:.2f}% of exact's extra memory "
        f"(−{100 * (1 - mem):.2f}%; paper −99.22%) and {100 * h['time_s'] / e['time_s']:.2f}% "
        f"of its time, on {payload['p']}×{payload['d']} at T={payload['T']}"
    ]


# ---------------------------------------------------------------------------------- results
def device_name(scale: Scale) -> str:
    if scale.device == "cuda":
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or "CPU"
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return f"{names[0] if names else cpu} (CPU, dry run)"


REQUIRED = ("transformers", "peft", "dprc_core")  # no cell runs without these


def preflight() -> tuple[str, bool]:
    """The libraries' versions, and whether the required ones import on this machine: the
    device's image lacks some of dprc_core's dependencies (dp-accounting, cryptography), which
    travel as wheels (docs/benchmarks/gpu.md); failing here costs seconds, not the loan."""
    parts, ok = [f"torch {torch.__version__}"], True
    for name in (*REQUIRED, "opacus"):
        if name == "opacus" and not HAVE_OPACUS:
            parts.append("opacus not installed")
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # an ImportError, or a library broken by its dependencies
            ok = ok and name not in REQUIRED
            parts.append(f"{name} FAILED ({short_error(exc)})")
            continue
        parts.append(f"{name} {getattr(module, '__version__', 'imports')}")
    return ", ".join(parts), ok


class Results:
    """gpu.json (the raw figures of every section) and gpu.md (its tables), under $OUT."""

    def __init__(self, out: Path):
        self.json_path, self.md_path = out / "gpu.json", out / "gpu.md"
        out.mkdir(parents=True, exist_ok=True)

    def load(self) -> dict[str, Any]:
        return json.loads(self.json_path.read_text()) if self.json_path.exists() else {}

    def update(self, key: str, payload: dict[str, Any]) -> None:
        data = self.load()
        data[key] = payload
        self.json_path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
        self.md_path.write_text(render(data))


def meta(scale: Scale, gpus: int, libraries: str) -> dict[str, Any]:
    return {
        "device": device_name(scale),
        "gpus": gpus,
        "dry_run": scale.name == "dry",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "versions": libraries,
        "python": platform.python_version(),
    }


def plan_payload(plan: Plan, lines: list[str]) -> dict[str, Any]:
    return {
        "budget_s": BUDGET_S,
        "total_estimate_s": plan.total_estimate(),
        "step_estimate_s": plan.step_estimate(),
        "sections": {n: {"estimate_s": e, "timeout_s": t} for n, (e, t) in SECTIONS.items()},
        "dropped": [c.key for c in plan.dropped],
        "dropped_groups": [_group_label(g) for g in plan.dropped_groups],
        "cell_estimates_s": plan.estimates,
        "printed": lines,
    }


# ---------------------------------------------------------------------------------- markdown
def _fmt_mib(mib: float | None, unit: str) -> str:
    if mib is None:
        return "–"
    return f"{mib / 1024:.2f}" if unit == "GiB" else f"{mib:.0f}"


def _ratio(x: float | None, ref: float | None) -> str:
    return f"{x / ref:.2f}×" if x and ref else "–"


def step_rows(cells: list[dict[str, Any]], unit: str) -> list[str]:
    """One row per cell: figures for a measured cell, its status in place of them otherwise."""
    base = {(r["variant"], r["T"], r["B"]): r for r in cells if r["mode"] == "nonprivate"}
    rows = []
    for r in cells:
        head = [r["variant"], MODE_LABELS[r["mode"]], str(r["T"]), str(r["B"])]
        if r["status"] != "ok":
            rows.append("| " + " | ".join([*head, r["status"], *["–"] * 7]) + " |")
            continue
        ref = base.get((r["variant"], r["T"], r["B"]), {})
        cells_ = [
            f"{r['step_s']:.3f}",
            f"{r['tokens_per_s']:,.0f}",
            _fmt_mib(r["steady_peak_mib"], unit),
            _fmt_mib(r["first_peak_mib"], unit),
            _ratio(r["first_peak_mib"], r["steady_peak_mib"]),
            _ratio(r["step_s"], ref.get("step_s")),
            _ratio(r["steady_peak_mib"], ref.get("steady_peak_mib")),
            f"{r['first_s']:.2f}",
        ]
        rows.append("| " + " | ".join([*head, *cells_]) + " |")
    return rows


def params_label(n: int) -> str:
    """A parameter count as people write it: 0.85B, 118M, 26.8k."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return str(n)


def methods_lines(cells: list[dict[str, Any]]) -> list[str]:
    """What dprc's norm methods resolved to per parameter, once per (variant, mode, T): the
    choice depends on T (and the layer), not on B."""
    seen: dict[tuple[str, str, int], str] = {}
    for r in cells:
        if r.get("methods"):
            used = ", ".join(f"{k} {n}" for k, n in r["methods"].items())
            seen.setdefault((r["variant"], r["mode"], r["T"]), used)
    return [f"- {v} {MODE_LABELS[m]} at T={t}: {used}" for (v, m, t), used in seen.items()]


def render_step(step: dict[str, Any], unit: str) -> list[str]:
    m = step["model"]
    return [
        "## One training step",
        "",
        f"Llama, {params_label(step['params'])} parameters ({model_label(m)}), random weights, "
        f"{step['dtype']}, sdpa attention; LoRA: peft r = {step['lora_r']} on every linear layer "
        "of the blocks. SGD; C = 1, σ = 1; dprc with its defaults (book-keeping clipped sums, "
        "per-example sketches, the independence check on step 1 when B ≥ 2). A fresh model per "
        f"cell: step 1, then {step['reps']} timed steps. Step s = their median; peaks = "
        f"`torch.cuda.max_memory_allocated` ({unit}; on the CPU: peak RSS), reset before each "
        "step: steady = the largest of the timed steps', first = step 1's. × NP: against the "
        "non-private cell of the same variant, T and B. "
        f"Section wall {step['wall_s']:.0f} s (estimate {step['estimate_s']:.0f} s).",
        "",
        f"| variant | mode | T | B | step s | tokens/s | steady peak {unit} | first-step peak "
        f"{unit} | first ÷ steady | time × NP | peak × NP | step 1 s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *step_rows(step["cells"], unit),
        "",
        "Norm methods dprc used (parameters per method):",
        "",
        *methods_lines(step["cells"]),
        "",
    ]


def render_norm(norm: dict[str, Any], unit: str) -> list[str]:
    rows = norm["rows"]
    exact = rows["exact"]
    lines = [
        "## The norm pass alone",
        "",
        f"One {norm['p']}×{norm['d']} linear layer, B = {norm['B']}, T = {norm['T']}, float32 "
        "(benchmarks/norm_layer.py's inputs and runner), in one process. Extra memory = peak − "
        f"memory in use before the run (MiB); time = median of {norm['reps']} interleaved runs.",
        "",
        "| method | used | extra memory MiB | % of exact | time ms | % of exact | GFLOP |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        if "time_s" not in r:
            lines.append(f"| {name} | {r['status']} | – | – | – | – | – |")
            continue
        mem_pct = (
            f"{100 * r['extra_mib'] / exact['extra_mib']:.2f}%" if exact.get("extra_mib") else "–"
        )
        time_pct = f"{100 * r['time_s'] / exact['time_s']:.2f}%" if "time_s" in exact else "–"
        lines.append(
            f"| {name}{f' k={K}' if name == 'hutch' else ''} | {r['used']} | {r['extra_mib']:.1f} "
            f"| {mem_pct} | {1e3 * r['time_s']:.2f} | {time_pct} | {r['gflop']:.2f} |"
        )
    return [*lines, "", *norm_summary(norm), ""]


def render(data: dict[str, Any]) -> str:
    """gpu.md from gpu.json: header (device, date, commit, plan), then each section present."""
    info, plan = data.get("meta", {}), data.get("plan", {})
    unit = "MiB" if info.get("dry_run", True) else "GiB"
    lines = [
        "# GPU check: one step of a ~0.85B Llama, and the norm pass alone (`scripts/gpu_check.sh`)",
        "",
    ]
    if info.get("dry_run"):
        lines += ["**Dry run**: toy sizes on the CPU; these figures say nothing about a GPU.", ""]
    lines += [
        f"- device: {info.get('device', 'unknown')}; GPUs: {info.get('gpus', '?')}",
        f"- date: {info.get('date', 'unknown')}; commit: {info.get('commit', 'unknown')}",
        f"- Python {info.get('python', '?')}, {info.get('versions', '?')}",
        f"- plan: estimate {plan.get('total_estimate_s', 0):.0f} s of a "
        f"{plan.get('budget_s', BUDGET_S):.0f} s budget; dropped by the plan: "
        + (", ".join(plan.get("dropped_groups", [])) or "none"),
        "",
    ]
    if "step" in data:
        lines += render_step(data["step"], unit)
    if "norm" in data:
        lines += render_norm(data["norm"], unit)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", action="store_true", help="print the plan and its estimate")
    what.add_argument("--section", choices=("step", "norm"), help="run one section")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="where gpu.json/md go")
    parser.add_argument("--inject-oom", default=None, help="test hook: this cell key raises OOM")
    parser.add_argument(
        "--exhaust-after", type=int, default=None, help="test hook: guard out of time at cell N"
    )
    args = parser.parse_args(argv)
    scale = DRY if args.dry_run else DEVICE
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run the toy version with --dry-run")
    if args.dry_run:
        torch.set_num_threads(1)  # toy sizes: threads only contend on a busy machine
    plan, results = make_plan(), Results(args.out)
    gpus = torch.cuda.device_count() if not args.dry_run else 0
    if args.plan:
        libraries, ok = preflight()
        lines = plan_lines(plan, args.dry_run, gpus)
        lines.insert(1, f"  libraries: {libraries}")
        print("\n".join(lines), flush=True)
        results.update("meta", meta(scale, gpus, libraries))
        results.update("plan", plan_payload(plan, lines))
        if not ok:
            print("cannot run: a required library does not import (see 'libraries' above)")
        return 0 if ok else 1
    if args.section == "norm":
        return run_norm_section(scale, results)
    hooks = dry_hooks(plan) if args.dry_run else Hooks()
    hooks.inject_oom = args.inject_oom or hooks.inject_oom
    if args.exhaust_after is not None:
        hooks.exhaust_after = args.exhaust_after
    return run_step_section(scale, plan, results, hooks)


if __name__ == "__main__":
    raise SystemExit(main())
