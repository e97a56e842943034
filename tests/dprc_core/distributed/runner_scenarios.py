"""A job run with its noise set to zero after planning, for test_fsdp_train.py: under
``torchrun`` (every rank) or as one process.

``python -m torch.distributed.run --standalone --nproc-per-node W runner_scenarios.py SPEC...``
runs the job of each YAML ``SPEC`` in turn (one launch: a rank's start costs seconds) through
the runner (``start_run``: loading, sharding, the engine, the sampler) with the engine's noise
std set to 0, so that the sharded run can be compared coordinate by coordinate with the single
process on the same Poisson batches.
"""

from __future__ import annotations

import os
import sys

import torch

from dprc_core.distributed import join_torchrun_group
from dprc_core.training.cli import load_spec
from dprc_core.training.runner import start_run


def run_without_noise(spec_path: str) -> None:
    spec = load_spec(spec_path)
    run = start_run(spec)
    run.engine.noise.std = 0.0  # type: ignore[union-attr]  (GaussianNoise: the planned σ·C)
    try:
        status = run.train(None, None)
    finally:
        run.engine.detach()
    run.finish(status, 0.0)


if __name__ == "__main__":
    joined = join_torchrun_group("cpu")
    for spec_path in sys.argv[1:]:
        run_without_noise(spec_path)
    if joined:
        torch.distributed.destroy_process_group()
        os._exit(0)  # gloo's threads can abort an orderly interpreter exit
