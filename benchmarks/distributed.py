"""Data-parallel DP-SGD throughput: 1 process against 2 ranks (torchrun), and the per-step
communication time of the clipped-sum reduction.

Model: the step benchmark's Llama (benchmarks/step.py: 4 layers, hidden 256, vocab 4096, float32,
~9.6M parameters, full fine-tuning), ``norm_method="hutch"`` (k = 32), book-keeping clipping.
Every configuration trains the same logical batches: ``B_LOGICAL`` random sequences of length
``T`` per step (the same indices on every rank; rank r takes indices ≡ r mod W), split into
micro-batches of at most ``MICRO`` per rank. Each configuration takes one warm-up step and then
``STEPS`` timed steps; the reported time per step is the median, the communication time is the
median of the time spent inside ``dprc_core.distributed.all_reduce_sum`` per step (rank 0).

Configurations (one run, one after the other, same machine):
* ``1 proc × 1 thread`` and ``1 proc × W threads`` — the single-process baselines;
* ``W procs × 1 thread`` over gloo — data-parallel, one core per rank.

Usage::

    .venv/bin/python benchmarks/distributed.py            # writes docs/benchmarks/distributed.md
    .venv/bin/python benchmarks/distributed.py --quick    # prints only (2 steps, T = 64)
    .venv/bin/python benchmarks/distributed.py --device cuda   # NCCL on the host's GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT  # noqa: E402

B_LOGICAL = 8
MICRO = 4
T = 256
STEPS = 6
WORLD = 2
DOC = ROOT / "docs" / "benchmarks" / "distributed.md"


def rank_main(args: argparse.Namespace) -> None:
    """One process of a configuration (a torchrun rank, or the single process)."""
    import torch

    import dprc_core.engine as engine_mod
    from benchmarks.step import model_dir
    from dprc_core import PrivacyEngine
    from dprc_core.clipping import Clipping, Hutch
    from dprc_core.distributed import current_ranks, shard_indices
    from dprc_core.losses import causal_lm_per_sample_loss
    from dprc_core.noise import Gaussian

    torch.set_num_threads(args.threads)
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if distributed:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    ranks = current_ranks()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    comm: list[float] = []
    inner = engine_mod.all_reduce_sum

    def timed(tensors, r):  # type: ignore[no-untyped-def]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        inner(tensors, r)
        if cuda:
            torch.cuda.synchronize()
        comm.append(time.perf_counter() - t0)

    engine_mod.all_reduce_sum = timed  # type: ignore[assignment]

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        model_dir(), use_safetensors=True, trust_remote_code=False
    ).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, Hutch(32)),
        noise=Gaussian(1.0),
        expected_batch_size=float(B_LOGICAL),
        seed=1,
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (B_LOGICAL, args.seq), generator=gen)
    times: list[float] = []
    comm_per_step: list[float] = []
    for step in range(args.steps + 1):
        part = shard_indices(torch.arange(B_LOGICAL), ranks)
        if distributed:
            torch.distributed.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        before = len(comm)
        for chunk in part.split(MICRO):
            batch = {"input_ids": ids[chunk].to(device), "labels": ids[chunk].to(device)}
            engine.accumulate(causal_lm_per_sample_loss, batch)
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        if step:  # the first step warms up
            times.append(time.perf_counter() - t0)
            comm_per_step.append(sum(comm[before:]))
    if ranks.is_main:
        Path(args.result).write_text(
            json.dumps(
                {
                    "step_s": statistics.median(times),
                    "comm_s": statistics.median(comm_per_step),
                    "world": ranks.world_size,
                    "threads": args.threads,
                }
            )
        )
    if distributed:
        torch.distributed.destroy_process_group()


def run_config(world: int, threads: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        own = [
            "--rank-main",
            f"--threads={threads}",
            f"--steps={args.steps}",
            f"--seq={args.seq}",
            f"--device={args.device}",
            f"--result={result}",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
        if world == 1:
            cmd = [sys.executable, str(Path(__file__).resolve()), *own]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={world}",
                str(Path(__file__).resolve()),
                *own,
            ]
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
        return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seq", type=int, default=T)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--result", default="")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--world", type=int, default=WORLD)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    if args.quick:
        args.steps, args.seq = 2, 64
    from benchmarks.step import model_dir

    model_dir()  # build the model once, before the processes race for it
    world = args.world
    configs = [(1, 1), (1, world), (world, 1)] if args.device == "cpu" else [(1, 1), (world, 1)]
    rows = []
    for w, threads in configs:
        r = run_config(w, threads, args)
        r["examples_per_s"] = B_LOGICAL / r["step_s"]
        rows.append(r)
        print(json.dumps(r))
    base = rows[0]["examples_per_s"]
    lines = [
        "## Data-parallel training (`benchmarks/distributed.py`)",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {__import__('torch').__version__}, device {args.device}. "
        f"Llama 4×256 (benchmarks/step.py's model), hutch k = 32, book-keeping clipping, "
        f"logical batch {B_LOGICAL} × T = {args.seq}, micro-batches ≤ {MICRO} per rank, "
        f"median of {args.steps} steps after one warm-up; communication = time inside the "
        "bucketed SUM reduction of the clipped sums (and the step statistics) per step.",
        "",
        "| processes × threads | s / step | examples / s | vs 1 × 1 | communication s / step |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['world']} × {r['threads']} | {r['step_s']:.3f} | {r['examples_per_s']:.2f} | "
            f"{r['examples_per_s'] / base:.2f}× | {r['comm_s']:.4f} |"
        )
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        target = DOC if args.device == "cpu" else DOC.with_name("distributed_cuda.md")
        target.write_text(text)


if __name__ == "__main__":
    main()
