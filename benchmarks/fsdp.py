"""Sharded (FSDP2) against data-parallel DP-SGD: per-rank memory and step time for W = 1 and 2
on a ~0.2B-parameter Llama (issue 29).

Configurations (one after the other, each in fresh processes, one torch thread a process):

* ``single`` — one process, the unsharded model, no process group;
* ``fsdp_w1`` — one rank under torchrun (a 1-rank gloo group), the model ``fully_shard``-ed;
* ``ddp_w2`` — two ranks (gloo), the whole model on each (not wrapped in DDP: the engine
  SUM-reduces the clipped sums itself);
* ``fsdp_w2`` — two ranks (gloo), the model sharded over them.

Every configuration trains the same logical batches (``Spec.batch`` random sequences of
``Spec.seq`` tokens; rank r takes indices ≡ r mod W with ``dprc_core.distributed.shard_indices``,
in micro-batches of at most ``Spec.micro``) with Adam, ``Clipping(1.0)`` (the engine's default norm
method and book-keeping clipped sum), ``Gaussian(1.0)``, float32. The sharded runs follow the
lockstep protocol of docs/engine.md ("Sharded models"): the most micro-batches of any rank is
agreed before the first pass, a rank with fewer pads.

The model is built on the meta device and materialised with ``to_empty`` — after
``fully_shard`` when sharded, so a rank never holds the whole model — and every parameter is
initialised from its own seeded generator (N(0, 0.02²) weights, unit norm weights): each rank
draws one whole parameter at a time and keeps its rows, so all configurations train the same
weights and construction holds at most one whole parameter beyond the rank's shards.

Measured per rank: the bytes of the local parameters, gradients and Adam state (``.to_local()``
of DTensors) after the last step; RSS when the timed steps start; the peak RSS of the warm-up
step (the independence check and Adam's state allocation happen there) and of the timed steps
(``/proc/self/status`` VmHWM reset through ``/proc/self/clear_refs`` at the start of each
phase, and VmRSS sampled every 5 ms by a thread: the larger); the peak of construction (VmHWM
before the first reset: the model, the optimizer and the engine built); the process's peak over
its life, the largest of the three (``ru_maxrss`` reads the same high-water mark, which the
resets clear, so it is taken before the first reset and combined with the phases' peaks); the
median time of the timed steps (after a barrier, one warm-up step first).

With glibc's default allocator (the main run) freed tensors under 32 MiB stay on its heap, so
the RSS includes fragmentation. ``--allocator live`` runs every process with
``MALLOC_MMAP_THRESHOLD_=131072`` (as benchmarks/step.py's *live* columns): each tensor of
128 KiB or more is its own mapping, returned to the OS when freed, so the RSS follows the live
tensors — at the price of slower steps (every such tensor is fresh, zero-filled pages). A live
run's JSON given with ``--live`` is shown as a second section of the page.

Usage::

    .venv/bin/python benchmarks/fsdp.py --allocator live --out /tmp/fsdp-live   # ~18 min
    .venv/bin/python benchmarks/fsdp.py --live /tmp/fsdp-live/fsdp.json  # docs/benchmarks/fsdp.*
    .venv/bin/python benchmarks/fsdp.py --smoke --out DIR  # a tiny model, 1 timed step, into DIR
    .venv/bin/python benchmarks/fsdp.py --render DIR/fsdp.json   # rewrite the page from a JSON
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.kit.memory import PeakRSS, peak_rss_bytes, rss_bytes  # noqa: E402
from benchmarks.kit.pages import PAGES  # noqa: E402

OUT = PAGES
LIVE_MMAP_THRESHOLD = 131072  # bytes: benchmarks/step.py's *live* allocator setting
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Spec:
    """The model and the batches of one run."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    seq: int  # T, tokens a sequence
    batch: int  # the logical batch
    micro: int  # the largest micro-batch a rank runs
    steps: int  # timed steps, after one warm-up step


FULL = Spec(
    hidden=1024,
    intermediate=2816,
    layers=12,
    heads=16,
    kv_heads=16,
    vocab=32000,
    seq=16,
    batch=4,
    micro=2,
    steps=3,
)
SMOKE = Spec(
    hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=515, seq=8, batch=4,
    micro=2, steps=1,
)  # fmt: skip
CUDA = Spec(
    hidden=1024, intermediate=2816, layers=12, heads=16, kv_heads=16, vocab=32000, seq=512,
    batch=8, micro=2, steps=3,
)  # fmt: skip
CUDA_CONFIGS = ("ddp_w2", "fsdp_w2")  # on 2 GPUs
# name: (ranks, sharded, what it is)
CONFIGS: dict[str, tuple[int, bool, str]] = {
    "single": (1, False, "1 process, unsharded, no process group"),
    "fsdp_w1": (1, True, "FSDP2, 1 rank (a 1-rank gloo group)"),
    "ddp_w2": (2, False, "data-parallel, 2 ranks, whole model on each"),
    "fsdp_w2": (2, True, "FSDP2, 2 ranks"),
}


# ------------------------------------------------------------------ one rank
def build_model(spec: Spec, sharded: bool, rank: int, world: int, device: str = "cpu") -> Any:
    """The Llama of ``spec``: built on the meta device, sharded (every decoder block, then the
    root) when ``sharded``, materialised with ``to_empty`` and initialised deterministically —
    each parameter from a generator seeded by its index, drawn whole one at a time, this
    rank's rows (torch.chunk's split, as FSDP2's) copied in."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=max(64, spec.seq),
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    if sharded:
        for module in model.modules():
            if type(module).__name__ == "LlamaDecoderLayer":
                fully_shard(module)
        fully_shard(model)
    model.to_empty(device=device)
    model.model.rotary_emb = LlamaRotaryEmbedding(config=cfg).to(device)  # buffers were on meta
    with torch.no_grad():
        for index, (_name, p) in enumerate(model.named_parameters()):
            gen = torch.Generator().manual_seed(1000 + index)
            if p.dim() == 1:
                whole = torch.ones(p.shape, dtype=p.dtype)
            else:
                whole = torch.empty(p.shape, dtype=p.dtype).normal_(0.0, 0.02, generator=gen)
            if hasattr(p, "to_local"):
                local = p.to_local()
                parts = whole.chunk(world, dim=0)
                if rank < len(parts) and local.numel():
                    local.copy_(parts[rank])
            else:
                p.copy_(whole)
            del whole
    model.train()
    return model


def _local_bytes(tensors: Any) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def rank_main(args: argparse.Namespace) -> None:
    """One process of a configuration (a torchrun rank, or the single process)."""
    import torch

    from dprc_core import PrivacyEngine
    from dprc_core.clipping import Clipping
    from dprc_core.distributed import all_reduce_max_int, current_ranks, shard_indices
    from dprc_core.losses import causal_lm_per_sample_loss
    from dprc_core.noise import Gaussian

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    spec = SMOKE if args.smoke else CUDA if cuda else FULL
    grouped = "WORLD_SIZE" in os.environ  # under torchrun: a process group, W = 1 included
    if cuda:  # one GPU a rank, NCCL (scripts/gpu_check.sh)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if grouped:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    ranks = current_ranks()
    rank = torch.distributed.get_rank() if grouped else 0
    world = torch.distributed.get_world_size() if grouped else 1
    rss_start = rss_bytes()

    t0 = time.perf_counter()
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    model = build_model(spec, args.shard, rank, world, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0),
        noise=Gaussian(1.0),
        expected_batch_size=float(spec.batch),
        seed=1,
    )
    setup_s = time.perf_counter() - t0
    rss_setup = rss_bytes()
    peak_setup = max(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab, (spec.batch, spec.seq), generator=gen)

    def batch(rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": ids[rows].to(device), "labels": ids[rows].to(device)}

    padding = batch(torch.arange(min(2, spec.batch)))

    def one_step() -> tuple[float, float]:
        part = shard_indices(torch.arange(spec.batch), ranks)
        chunks = list(part.split(spec.micro)) if len(part) else []
        if grouped:
            torch.distributed.barrier()
        start = time.perf_counter()
        most = all_reduce_max_int(len(chunks), engine.ranks)  # before any pass: lockstep
        for chunk in chunks:
            engine.accumulate(causal_lm_per_sample_loss, batch(chunk), example_ids=chunk)
        for _ in range(most - len(chunks)):
            engine.pad(causal_lm_per_sample_loss, padding)
        stats = engine.step()
        return time.perf_counter() - start, stats.mean_loss

    with PeakRSS() as warm:
        warm_s, _ = one_step()
    rss_steps_start = rss_bytes()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    with PeakRSS() as steps:
        for _ in range(spec.steps):
            s, loss = one_step()
            times.append(s)
            losses.append(loss)

    params = list(model.parameters())
    state = [
        v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
    ]
    scalars = [
        v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() == 0
    ]
    result = {
        "rank": rank,
        "world": world,
        "sharded": bool(args.shard),
        "engine_sharded": bool(engine.sharded),
        "params": sum(p.numel() for p in params),  # the whole model's
        "whole_param_bytes": sum(p.numel() * p.element_size() for p in params),
        "param_bytes": _local_bytes(params),
        "grad_bytes": _local_bytes(p.grad for p in params),
        "optim_bytes": _local_bytes(state),
        "optim_scalar_bytes": _local_bytes(scalars),
        "largest_param_bytes": max(p.numel() * p.element_size() for p in params),
        "shapes": {n: [list(p.shape), p.element_size()] for n, p in model.named_parameters()},
        "rss_start": rss_start,
        "rss_setup": rss_setup,
        "rss_steps_start": rss_steps_start,
        "peak_warmup": warm.peak(),
        "peak_steps": steps.peak(),
        "peak_steps_sampled": steps.sampled,
        "peak_steps_hwm": steps.hwm,
        "peak_setup": peak_setup,
        # the life's peak: ru_maxrss is the high-water mark clear_refs resets, so combine
        "ru_maxrss": max(
            peak_setup,
            warm.peak(),
            steps.peak(),
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        ),
        "setup_s": setup_s,
        "warmup_s": warm_s,
        "step_s": times,
        "median_step_s": statistics.median(times),
        "mean_loss": losses,
    }
    if cuda:  # the device's peaks: the timed steps', and the whole process's
        result["cuda_peak_steps"] = torch.cuda.max_memory_allocated()
        result["cuda_device"] = torch.cuda.get_device_name()
    Path(args.result).with_name(f"rank{rank}.json").write_text(json.dumps(result))
    if grouped:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    # As tests/dprc_core/distributed/fsdp_scenarios.py: leave without C++ static destructors
    # (after FSDP2 on gloo a background thread can abort the interpreter's exit).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------ the driver
def run_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    world, sharded, _ = CONFIGS[name]
    with tempfile.TemporaryDirectory() as tmp:
        own = [f"--result={Path(tmp) / 'result.json'}", *(["--shard"] if sharded else [])]
        own += ["--smoke"] if args.smoke else []
        own += [f"--device={args.device}"]
        script = str(Path(__file__).resolve())
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        if args.allocator == "live":
            env["MALLOC_MMAP_THRESHOLD_"] = str(LIVE_MMAP_THRESHOLD)
        if name == "single":
            cmd = [sys.executable, script, "--rank-main", *own]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += [f"--nproc-per-node={world}", script, "--rank-main", *own]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
        wall = time.perf_counter() - t0
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world)]
    shapes = ranks[0].pop("shapes")
    for r in ranks[1:]:
        r.pop("shapes")
    return {"world": world, "sharded": sharded, "wall_s": wall, "ranks": ranks, "shapes": shapes}


def state_bytes(rank: dict[str, Any]) -> int:
    """A rank's local parameters + Adam state (the issue's criterion)."""
    return int(rank["param_bytes"] + rank["optim_bytes"])


def resident_bytes(rank: dict[str, Any]) -> int:
    """A rank's local parameters + gradients + Adam state."""
    return int(rank["param_bytes"] + rank["grad_bytes"] + rank["optim_bytes"])


def _mib(b: float) -> str:
    return f"{b / MiB:,.0f}"


def _gib(b: float) -> str:
    return f"{b / GiB:.2f}"


def _above(rank: dict[str, Any]) -> int:
    """The peak RSS of the timed steps above the RSS before the model existed."""
    return int(rank["peak_steps"] - rank["rss_start"])


def _added(rank: dict[str, Any]) -> int:
    """What a timed step adds to the RSS at which the timed steps start."""
    return int(rank["peak_steps"] - rank["rss_steps_start"])


def _opt(rank: dict[str, Any], key: str) -> str:
    """A life or construction peak ("—" for a run from before they were recorded)."""
    return _mib(rank[key]) if "peak_setup" in rank else "—"


def _worst(results: dict[str, Any], name: str, key: Any) -> float:
    """The larger rank's figure of a configuration."""
    return float(max(key(r) for r in results[name]["ranks"]))


METRICS: list[tuple[str, Any]] = [
    ("params + Adam", state_bytes),
    ("params + grads + Adam", resident_bytes),
    ("peak RSS, steps", lambda r: r["peak_steps"]),
    ("peak RSS, steps − RSS before the model", _above),
    ("peak RSS, warm-up", lambda r: r["peak_warmup"]),
    ("peak RSS, construction", lambda r: r.get("peak_setup", math.nan)),
    ("ru_maxrss", lambda r: r["ru_maxrss"] if "peak_setup" in r else math.nan),
    ("s / step", lambda r: r["median_step_s"]),
]


def _command(meta: dict[str, Any]) -> str:
    flags = " --smoke" if meta["spec"] == asdict(SMOKE) else ""
    flags += " --allocator live --out /tmp/fsdp-live" if meta["allocator"] == "live" else ""
    return f"python benchmarks/fsdp.py{flags}"


def _run_line(meta: dict[str, Any], command: str) -> str:
    return (
        f"`{command}`: run {meta['date']}, dprc {meta.get('commit', '?')}, the four "
        f"configurations one after the other in fresh processes, {meta['total_s'] / 60:.1f} "
        f"min in all; 1-minute load average {meta['load'][0]:.1f} before and "
        f"{meta['load'][1]:.1f} after"
    )


def _rank_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| configuration | rank | params | grads | Adam state | params + grads + Adam | "
        "RSS before the model | RSS at steps | peak RSS, warm-up | peak RSS, steps | "
        "peak, steps − RSS at steps | peak RSS, construction | ru_maxrss | s / step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        for r in res["ranks"]:
            lines.append(
                f"| {name} | {r['rank']} | {_mib(r['param_bytes'])} | {_mib(r['grad_bytes'])} | "
                f"{_mib(r['optim_bytes'])} | {_mib(resident_bytes(r))} | {_mib(r['rss_start'])} | "
                f"{_mib(r['rss_steps_start'])} | {_mib(r['peak_warmup'])} | "
                f"{_mib(r['peak_steps'])} | {_mib(_added(r))} | {_opt(r, 'peak_setup')} | "
                f"{_opt(r, 'ru_maxrss')} | "
                f"{r['median_step_s']:.2f} |"
            )
    return lines


def _ratio_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| FSDP W = 2 per rank against | " + " | ".join(m for m, _ in METRICS) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for base in ("single", "fsdp_w1", "ddp_w2"):
        if base in results and "fsdp_w2" in results:
            row = [_worst(results, "fsdp_w2", k) / _worst(results, base, k) for _, k in METRICS]
            cells = ["—" if math.isnan(v) else f"{v:.2f}×" for v in row]
            lines.append(f"| {base} | " + " | ".join(cells) + " |")
    return lines


def render(report: dict[str, Any]) -> str:
    results, meta = report["configs"], report["_meta"]
    live = report.get("live")
    spec = Spec(**meta["spec"])
    single = results["single"]["ranks"][0]
    whole = single["whole_param_bytes"]
    lines = [
        "## Sharded (FSDP2) against data-parallel DP-SGD: per-rank memory and step time (issue 29)",
        "",
        f"{_run_line(meta, meta['command'])} (glibc's default allocator)"
        + (f"; {_run_line(live['_meta'], _command(live['_meta']))} (live tensors)" if live else "")
        + "."
        + (f" {live['_meta']['note']}" if live and live["_meta"].get("note") else "")
        + f" {meta['machine']}; the 2 cores were shared with other work, which slows the "
        "steps, the two-rank ones most. Raw figures: [fsdp.json](fsdp.json).",
        "",
        f"Model: a Llama built locally with random weights (nothing downloaded): hidden "
        f"{spec.hidden}, {spec.layers} layers, MLP {spec.intermediate}, {spec.heads} heads "
        f"({spec.kv_heads} key/value), vocabulary {spec.vocab}, untied embeddings — "
        f"{single['params'] / 1e6:.1f}M parameters, float32: P = {_mib(whole)} MiB (the largest "
        f"parameter {_mib(single['largest_param_bytes'])} MiB). Adam (lr 1e-4), `Clipping(1.0)` "
        f"(the engine's default: {meta['norm']}, book-keeping clipped sum, independence check "
        f"on), `Gaussian(1.0)`; logical batch {spec.batch} × T = {spec.seq}, micro-batches ≤ "
        f"{spec.micro} per rank (rank r takes indices ≡ r mod W); one warm-up step, then the "
        f"median of {spec.steps} steps. The model is built on the meta device and materialised "
        "after sharding (`to_empty`, then each parameter drawn whole from its own seed, one at a "
        "time, the rank's rows kept), so every configuration trains the same weights and "
        "construction holds at most one whole parameter beyond the rank's own.",
        "",
        "Configurations: "
        + "; ".join(f"`{n}` — {CONFIGS[n][2]}" for n in results)
        + ". Each rank runs one torch thread.",
        "",
        "### Per rank",
        "",
        "Bytes (MiB): the rank's local tensors after the last step (`.to_local()` of the "
        "DTensors). RSS (MiB): before the model is built (libraries), when the timed steps start, "
        "the peak of the warm-up step (independence check; Adam's state allocated) and of the "
        "timed steps (VmHWM reset at the phase's start, and VmRSS sampled every 5 ms), of "
        "construction (model, optimizer, engine) and of the process's whole life (`ru_maxrss`: "
        "the largest of the three).",
        "",
        *_rank_table(results),
        "",
        "FSDP W = 2 per rank as a ratio (the larger rank of each configuration):",
        "",
        *_ratio_table(results),
    ]
    if live:
        lines += [
            "",
            "### Live tensors",
            "",
            f"The same run with `MALLOC_MMAP_THRESHOLD_={LIVE_MMAP_THRESHOLD}`: every tensor of "
            "128 KiB or more is its own mapping, unmapped when freed, so the RSS follows the live "
            "tensors instead of glibc's heap (which keeps freed tensors under 32 MiB resident). "
            "Every step then maps fresh, zero-filled pages for its tensors, which makes the steps "
            "slower: compare these times only with each other.",
            "",
            *_rank_table(live["configs"]),
            "",
            *_ratio_table(live["configs"]),
        ]
    lines += ["", "### Reading", ""]
    lines += reading(results, meta, live["configs"] if live else None)
    lines.append("")
    return "\n".join(lines)


def reading(
    results: dict[str, Any], meta: dict[str, Any], live: dict[str, Any] | None
) -> list[str]:
    """A short reading of the figures, computed from them."""
    if not {"single", "ddp_w2", "fsdp_w2"} <= results.keys():
        return []
    single = results["single"]["ranks"][0]
    whole = single["whole_param_bytes"]
    f2, d2 = results["fsdp_w2"]["ranks"], results["ddp_w2"]["ranks"]

    def units(b: float) -> str:
        return f"{b / whole:.2f} P"

    out = [
        f"* **Resident state: 1/W.** An FSDP W = 2 rank holds "
        f"{' and '.join(f'{state_bytes(r) / state_bytes(single):.3f}×' for r in f2)} of the "
        f"single process's parameters + Adam state (the issue's bound: ½, plus torch.chunk's "
        f"odd rows), and its gradients are sharded as well: "
        f"{' and '.join(_mib(resident_bytes(r)) for r in f2)} MiB of parameters + gradients + "
        f"Adam against {_mib(resident_bytes(d2[0]))} MiB = 4 P on each data-parallel rank "
        f"(parameters, gradients, two Adam moments)."
    ]

    def spread(res: dict[str, Any], name: str) -> tuple[float, float]:
        values = [_above(r) for r in res[name]["ranks"]]
        return min(values), max(values)

    def span(lo: float, hi: float, fmt: Any) -> str:
        return fmt(hi) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"

    def peaks(res: dict[str, Any], how: str) -> str:
        f_lo, f_hi = spread(res, "fsdp_w2")
        d_lo, d_hi = spread(res, "ddp_w2")
        one = _above(res["single"]["ranks"][0])
        return (
            f"{how}: FSDP W = 2 {span(f_lo, f_hi, _gib)} GiB ({span(f_lo, f_hi, units)}), "
            f"data-parallel W = 2 {span(d_lo, d_hi, _gib)} GiB ({span(d_lo, d_hi, units)}), "
            f"single process {_gib(one)} GiB ({units(one)}) — the larger FSDP rank "
            f"{span(f_hi / d_hi, f_hi / d_lo, lambda v: f'{v:.2f}')}× a data-parallel rank"
        )

    text = (
        "* **Peak RSS per rank** in the timed steps, above the RSS before the model was built "
        f"(about {_mib(single['rss_start'])} MiB of libraries), "
        + peaks(results, "glibc's default allocator")
    )
    if live:
        text += "; " + peaks(live, "live tensors")
    out.append(
        text + f". With the libraries: {_gib(_worst(results, 'fsdp_w2', _peak))} against "
        f"{_gib(_worst(results, 'ddp_w2', _peak))} GiB "
        f"({_worst(results, 'fsdp_w2', _peak) / _worst(results, 'ddp_w2', _peak):.2f}×)."
    )
    acc = live or results
    add_f = _worst(acc, "fsdp_w2", _added)
    add_d = _worst(acc, "ddp_w2", _added)
    add_1 = acc["single"]["ranks"][0]
    add_1b = _added(add_1)
    largest = single["largest_param_bytes"]
    held = (
        f"less than one whole gradient: the rank's rows of the logical batch's clipped sum "
        f"(P/W = {_mib(whole / 2)} MiB) and, while each micro-batch's clipped sum is SUM-reduced "
        f"to the shards a bucket at a time, the whole sums of one bucket or of one parameter "
        f"(the largest, {_mib(largest)} MiB), with the all-gathered blocks, activations and "
        f"book-keeping factors of a micro-batch (small at T = {meta['spec']['seq']}). No rank "
        f"holds a whole gradient"
        if add_f < 0.9 * whole
        else "at least one whole gradient: a clipped sum is held whole somewhere in the step"
    )
    out.append(
        f"* **What is held whole** ({'live tensors' if live else 'default allocator'}). Between "
        f"steps a rank holds its 4 P/W of parameters, gradients and Adam state; a step adds "
        f"{units(add_f)} ({_mib(add_f)} MiB) on an FSDP W = 2 rank — {held}. A data-parallel "
        f"rank adds {units(add_d)} and the single process {units(add_1b)}: their clipped sum "
        f"accumulates in `.grad` (within the 4 P), and `step()` adds the noised copy and the "
        f"division by q·N (and, with W = 2, the reduction) on top. So the per-rank peak is "
        f"about 4 P/W + P/W + (the step's transients), against 4 P + {units(add_d)} unsharded."
    )
    if live is not None:
        frag = {
            n: [_above(a) - _above(b) for a in results[n]["ranks"] for b in live[n]["ranks"]]
            for n in ("fsdp_w2", "ddp_w2", "single")
        }
        fr = {n: span(min(v), max(v), _mib) for n, v in frag.items()}
        d_lo, d_hi = spread(results, "ddp_w2")
        ld_lo, ld_hi = spread(live, "ddp_w2")
        out.append(
            "* **Allocator.** glibc's heap keeps freed tensors resident: default against live "
            f"peaks above the libraries, it adds {fr['fsdp_w2']} MiB on an FSDP W = 2 rank, "
            f"{fr['ddp_w2']} MiB on a data-parallel rank and {fr['single']} MiB in the single "
            "process, and it varies between "
            f"processes doing the same work: the two data-parallel ranks peak "
            f"{_mib(d_hi - d_lo)} MiB apart with it and {_mib(ld_hi - ld_lo)} MiB apart live. "
            "The accounting above is read from the live figures."
        )
    ru_f = _worst(results, "fsdp_w2", lambda r: r["ru_maxrss"])
    ru_d = _worst(results, "ddp_w2", lambda r: r["ru_maxrss"])
    made_f = _worst(results, "fsdp_w2", lambda r: r.get("peak_setup", math.nan))
    made_d = _worst(results, "ddp_w2", lambda r: r.get("peak_setup", math.nan))
    out.append(
        f"* **Construction.** Building on the meta device and materialising the shards peaks at "
        f"{_gib(made_f)} GiB on an FSDP W = 2 rank (its shards, at most one whole parameter "
        f"being drawn, the libraries; Adam's state comes with the first step) against "
        f"{_gib(made_d)} GiB on a data-parallel rank; the process's life peak (`ru_maxrss`, "
        f"construction, warm-up step with its independence check, timed steps) is "
        f"{_gib(ru_f)} GiB against {_gib(ru_d)} GiB."
    )
    if "fsdp_w1" in results:
        f1 = results["fsdp_w1"]["ranks"][0]
        out.append(
            f"* **FSDP on one rank** runs (a 1-rank gloo group): "
            f"{state_bytes(f1) / state_bytes(single):.2f}× the single process's parameters + "
            f"Adam state, peak RSS {_gib(f1['peak_steps'])} GiB against "
            f"{_gib(single['peak_steps'])} GiB, {f1['median_step_s']:.2f} s a step against "
            f"{single['median_step_s']:.2f} s."
        )
    t_f = _worst(results, "fsdp_w2", lambda r: r["median_step_s"])
    t_d = _worst(results, "ddp_w2", lambda r: r["median_step_s"])
    behind = [n for n, t in (("FSDP", t_f), ("data-parallel", t_d)) if t >= single["median_step_s"]]
    slow = (
        f" The {' and the '.join(behind)} W = 2 run{'s are' if len(behind) > 1 else ' is'} not "
        "faster than the one process here: with this small batch, what does not shrink with a "
        "rank's share of it (the reductions over loopback gloo, and for data parallelism the "
        "noise and Adam on the whole parameters) takes what the halved compute saves, and the "
        "two ranks share the two cores with the other work."
        if behind
        else ""
    )
    out.append(
        f"* **Step time** (default allocator). {t_f:.2f} s a step with FSDP W = 2, {t_d:.2f} s "
        f"data-parallel, {single['median_step_s']:.2f} s in one process (one thread a rank, "
        f"gloo over loopback on {meta['cpus']} cores shared with other work). Each W = 2 rank "
        f"computes half the batch; FSDP adds the all-gathers of every block's parameters in the "
        f"forward and again in the backward (P/W received per rank each time) and reduces each "
        f"micro-batch's whole clipped sum, the data-parallel ranks reduce one whole gradient a "
        f"step." + slow
    )
    return out


def _peak(r: dict[str, Any]) -> int:
    return int(r["peak_steps"])


def _ordered(configs: dict[str, Any]) -> dict[str, Any]:
    return {n: configs[n] for n in CONFIGS if n in configs}


def write(out: Path, report: dict[str, Any]) -> None:
    report["configs"] = _ordered(report["configs"])
    if "live" in report:
        report["live"]["configs"] = _ordered(report["live"]["configs"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "fsdp.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    text = render(report)
    (out / "fsdp.md").write_text(text)
    print(text)


def _commit() -> str:
    """HEAD's short hash, "+" when dprc_core has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "dprc_core"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "?"
    return (head or "?") + ("+" if dirty else "")


def cuda_main(args: argparse.Namespace) -> None:
    """Data-parallel and FSDP2 on 2 GPUs (NCCL): each rank's device memory peak in the timed
    steps, its local parameters + gradients + Adam state, the step time."""
    t0 = time.perf_counter()
    results = {name: run_config(name, args) for name in CUDA_CONFIGS}
    spec = SMOKE if args.smoke else CUDA
    lines = [
        "## FSDP2 against data-parallel on 2 GPUs (NCCL)",
        "",
        f"`python benchmarks/fsdp.py --device cuda`: {spec.layers} layers, hidden {spec.hidden}, "
        f"vocabulary {spec.vocab}, float32, Adam; logical batch {spec.batch} × T = {spec.seq}, "
        f"micro-batches ≤ {spec.micro} a rank; the median of {spec.steps} steps after one; "
        f"{time.perf_counter() - t0:.0f} s in all.",
        "",
        "| configuration | rank | device | params + grads + Adam (MiB) | peak allocated, steps "
        "(MiB) | s / step |",
        "|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        for r in res["ranks"]:
            lines.append(
                f"| {name} | {r['rank']} | {r.get('cuda_device', '?')} | "
                f"{_mib(resident_bytes(r))} | {_mib(r['cuda_peak_steps'])} | "
                f"{r['median_step_s']:.3f} |"
            )
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fsdp_cuda.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    (args.out / "fsdp_cuda.md").write_text(text)
    print(text)
    fsdp, ddp = results["fsdp_w2"]["ranks"], results["ddp_w2"]["ranks"]
    print(
        "summary: fsdp on 2 GPUs: peak "
        + ", ".join(_mib(r["cuda_peak_steps"]) for r in fsdp)
        + " MiB a rank, data-parallel "
        + ", ".join(_mib(r["cuda_peak_steps"]) for r in ddp)
        + " MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shard", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 1 timed step")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for fsdp.json and fsdp.md")
    parser.add_argument("--allocator", choices=["default", "live"], default="default")
    parser.add_argument("--live", type=Path, help="a live run's fsdp.json, shown on the page")
    parser.add_argument("--render", type=Path, help="rewrite fsdp.md from this fsdp.json")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: data-parallel and FSDP2 on 2 GPUs over NCCL, each rank's "
        "torch.cuda.max_memory_allocated (fsdp_cuda.json/.md in --out)",
    )
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    if args.device == "cuda":
        cuda_main(args)
        return
    if args.render:
        report = json.loads(args.render.read_text())
        write(args.render.parent if args.out == OUT else args.out, report)
        return
    spec = SMOKE if args.smoke else FULL
    live = json.loads(args.live.read_text()) if args.live else None
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    results: dict[str, Any] = {}
    for name in CONFIGS:
        results[name] = run_config(name, args)
        print(
            f"{name}: "
            + ", ".join(
                f"rank {x['rank']}: state {_mib(resident_bytes(x))} MiB, peak "
                f"{_mib(x['peak_steps'])} MiB, {x['median_step_s']:.2f} s/step"
                for x in results[name]["ranks"]
            ),
            flush=True,
        )
    import torch

    from dprc_core.clipping import Clipping

    norm = Clipping(1.0).norm
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch "
        f"{torch.__version__}, gloo, one torch thread a process",
        "cpus": os.cpu_count(),
        "allocator": args.allocator,
        "commit": _commit(),
        "load": [load_before, os.getloadavg()[0]],
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "spec": asdict(spec),
        "norm": f"{norm.method}"
        + (f", k = {norm.k}, {norm.sketch} sketches" if norm.randomized else ""),
        "total_s": time.perf_counter() - t0,
        "shapes": results["single"]["shapes"],
    }
    meta["command"] = _command(meta) + (f" --live {args.live}" if args.live else "")
    for res in results.values():
        res.pop("shapes")
    report: dict[str, Any] = {"_meta": meta, "configs": results}
    if live is not None:
        live["_meta"].pop("shapes", None)
        report["live"] = {"_meta": live["_meta"], "configs": live["configs"]}
    write(args.out, report)


if __name__ == "__main__":
    main()
