"""The multi-node section of scripts/gpu_check.sh (issue 46): a job on 2 Ray "nodes" of one
machine, a GPU each (NCCL), against the same job in one process.

Starts a Ray head and a second node with ``ray start`` (each sees one GPU through
``CUDA_VISIBLE_DEVICES``, so Ray gives each rank its own), trains a tiny Llama with
``dprc train --nodes 2 --ray-address`` and with plain ``dprc train``, and prints one ``summary:``
line: the steps and ε of both (they must be equal: the plan does not depend on the shape), the
largest weight difference (float32, the sum reduced in another order: rounding only) and the
wall times. ``--device cpu`` runs the same path on CPUs (gloo), to try the script without GPUs.

    python scripts/ray_gpu_check.py [--device cuda|cpu] [--port 6390]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _ray(*args: str, env: dict[str, str]) -> None:
    ray = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    subprocess.run([*ray, *args], env=env, check=True, capture_output=True, timeout=120)


def _train(spec: Path, env: dict[str, str], *extra: str) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "dprc_core.cli", "train", str(spec), "--quiet", *extra]
    begun = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"dprc train {' '.join(extra)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :]), time.monotonic() - begun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--port", type=int, default=6390)
    args = parser.parse_args(argv)
    from safetensors.torch import load_file

    from dprc_core.training import checkpoint as ckpt_io
    from dprc_core.training.tiny import build_tiny_llama

    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    env["OMP_NUM_THREADS"] = "1"
    gpus = args.device == "cuda"
    with tempfile.TemporaryDirectory(prefix="ray-gpu-check-") as tmp:
        base = Path(tmp)
        model = build_tiny_llama(base / "llama", hidden=64)
        data = base / "train.jsonl"
        data.write_text("".join(json.dumps({"text": "ab" * (3 + i % 5)}) + "\n" for i in range(64)))
        job = {"model": str(model), "task": "causal_lm", "train_file": str(data), "epochs": 2,
               "batch_size": 8, "learning_rate": 1e-2, "max_seq_len": 16, "seed": 3,
               "target_epsilon": 4.0, "norm_method": "hutch", "k": 4, "device": args.device,
               "checkpoint_every": 1000}  # fmt: skip
        specs = {}
        for name in ("one", "ray"):
            (base / name).mkdir()
            specs[name] = base / name / "job.yaml"
            specs[name].write_text(yaml.safe_dump({**job, "output_dir": str(base / name / "out")}))
        one, one_s = _train(specs["one"], env)
        address = f"127.0.0.1:{args.port}"
        node = ["--num-gpus=1", "--num-cpus=1"] if gpus else ["--num-cpus=1"]
        try:
            _ray("start", "--head", f"--port={args.port}", "--include-dashboard=false", *node,
                 env={**env, "CUDA_VISIBLE_DEVICES": "0"})  # fmt: skip
            _ray("start", f"--address={address}", *node, env={**env, "CUDA_VISIBLE_DEVICES": "1"})
            two, two_s = _train(specs["ray"], env, "--nodes=2", f"--ray-address={address}")
        finally:
            _ray("stop", "--force", env=env)
        weights = [
            load_file(
                str(ckpt_io.latest_checkpoint(base / n / "out") / "model" / "model.safetensors")
            )
            for n in ("one", "ray")
        ]
        diff = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    same = one["steps"] == two["steps"] and one["epsilon"] == two["epsilon"]
    label = "GPU (NCCL)" if gpus else "CPU (gloo)"
    print(
        f"summary: ray 2 nodes × 1 {label}: steps {two['steps']} / one process "
        f"{one['steps']}, ε {two['epsilon']:.6f} / "
        f"{one['epsilon']:.6f} ({'equal' if same else 'DIFFERENT'}), max |Δw| {diff:.2e}, "
        f"wall {two_s:.1f} s / {one_s:.1f} s"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
