"""The ranks of test_ray_train.py's no-noise runs under Ray: ``python -m
tests.dprc_core.distributed.ray_scenarios ADDRESS NODES DEVICES SPEC...`` drives
:func:`dprc_core.training.ray_launch.run_on_ray` with :func:`no_noise_rank`, which runs each
YAML ``SPEC`` through the runner with the noise set to zero (runner_scenarios.py), and rank 0
writes where the ranks ran to ``placement.json`` beside the first spec."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def no_noise_rank(config: dict) -> None:
    from dprc_core.training.ray_launch import join_ray_rank, placement
    from tests.dprc_core.distributed.runner_scenarios import run_without_noise

    join_ray_rank()
    nodes = placement()
    for spec in config["specs"]:
        run_without_noise(spec)
    import torch

    if torch.distributed.get_rank() == 0:
        (Path(config["specs"][0]).parent / "placement.json").write_text(json.dumps(nodes))


def main(argv: list[str]) -> int:
    from dprc_core.training.ray_launch import Shape, run_on_ray

    address, nodes, devices, *specs = argv
    with tempfile.TemporaryDirectory() as storage:
        run_on_ray(
            no_noise_rank,
            {"specs": specs},
            Shape(int(nodes), int(devices)),
            address=address,
            storage=Path(storage),
            use_gpu=False,
            wait_seconds=60,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
