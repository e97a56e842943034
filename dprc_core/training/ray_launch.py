"""A job on several hosts: ``nodes × devices`` ranks placed by Ray Train (docs/training.md,
"Several hosts").

Ray is the engine that places the ranks; dprc's privacy does not depend on where they run.
:func:`run_on_ray` connects to a running Ray cluster (``address``: its GCS ``HOST:6379``; the
calling host must be a node of that cluster, e.g. ``ray start --address=HOST:6379
--num-cpus=0``), waits until the cluster has ``nodes`` nodes with ``devices`` devices each,
and runs ``loop(config)`` in ``nodes × devices`` workers of Ray Train's ``TorchTrainer``, one
rank per device. ``TorchTrainer`` forms the ``torch.distributed`` default group before
``loop`` runs (gloo on CPU, NCCL on GPUs), so the job's code finds the group as it does under
``torchrun`` (:func:`dprc_core.distributed.current_ranks`): the same Poisson batch from rank 0's
seed, each rank its part, one noise draw per coordinate (docs/design.md §3).

* **Placement.** One worker per device (``{"GPU": 1}`` or ``{"CPU": 1}``); with one device a
  node, ``STRICT_SPREAD`` (every rank on its own node); with several, ``SPREAD``. Each rank
  reports its node (:func:`placement`), so the caller can say where the ranks ran.
* **Faults.** Ray restarts nothing (``FailureConfig(max_failures=0)``): a rank that raises or a
  node that dies ends the call (:class:`RayRunFailed`); the caller decides whether to resume
  from the last checkpoint, as after a rank that dies under ``torchrun``.
* **Storage.** The job's files (model, data, ``output_dir``) are opened by path on every node:
  they must be on storage every node reaches at the same path (NFS, a ReadWriteMany volume).
* **Environment.** The ranks get the caller's ``DPRC_*``, ``HF_*``, ``TRANSFORMERS_*``,
  ``OMP_NUM_THREADS`` and ``PYTHONPATH`` (:data:`FORWARDED_ENV`, Ray's job-level
  ``runtime_env``), and start in the caller's working folder when their node has it.
* **Lifetime.** The workers are Ray actors owned by this process (the driver): when it exits,
  killed or not, Ray ends them.

Ray is an optional dependency (``pip install 'dprc[ray]'``); it is imported only here, and
only when a job asks for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RAY_MISSING = "multi-node jobs run through Ray, which is not installed: pip install 'dprc[ray]'"
WAIT_POLL_SECONDS = 1.0
# the environment the ranks get from the caller (Ray's workers start from their node's):
# the offline switches, the token store's folder, the thread count, the import path
FORWARDED_ENV = ("DPRC_", "HF_", "TRANSFORMERS_", "OMP_NUM_THREADS", "PYTHONPATH")


class NodesUnavailable(RuntimeError):
    """The Ray cluster does not have the job's nodes (after waiting)."""

    code = "nodes_unavailable"


class RayRunFailed(RuntimeError):
    """A rank raised, or a node (or its process) died: the run ended without finishing."""


@dataclass(frozen=True)
class Shape:
    """Where a job's ranks run: ``nodes`` hosts with ``devices`` devices (ranks) each."""

    nodes: int = 1
    devices: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "devices"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices

    def __str__(self) -> str:
        return f"{self.nodes} node(s) × {self.devices} device(s)"


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError(RAY_MISSING) from exc
    return ray


def run_on_ray(
    loop: Callable[[dict], None],
    config: dict,
    shape: Shape,
    *,
    address: str,
    storage: Path,
    use_gpu: bool | None = None,
    wait_seconds: float = 300.0,
    name: str = "dprc",
) -> None:
    """Run ``loop(config)`` on ``shape.world_size`` ranks of the Ray cluster at ``address``;
    returns when every rank has returned. ``storage``: a folder every node reaches (Ray Train
    keeps its run state there). Raises :class:`NodesUnavailable` when the cluster lacks the
    nodes after ``wait_seconds``, :class:`RayRunFailed` when the run ends without finishing.
    ``use_gpu`` None: a GPU per rank when the cluster has GPUs."""
    ray = import_ray()
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    deadline = time.monotonic() + wait_seconds
    wait_for_address(address, wait_seconds)  # ray.init waits minutes on an address that is down
    ray.init(
        address=address,
        logging_level=logging.WARNING,
        log_to_driver=True,
        runtime_env={"env_vars": forwarded_env()},
    )
    try:
        if use_gpu is None:
            use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        wait_for_nodes(shape, use_gpu, max(deadline - time.monotonic(), 0.0))
        trainer = TorchTrainer(
            loop,
            train_loop_config=config,
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            scaling_config=ScalingConfig(
                num_workers=shape.world_size,
                use_gpu=use_gpu,
                resources_per_worker={"GPU": 1} if use_gpu else {"CPU": 1},
                placement_strategy="STRICT_SPREAD" if shape.devices == 1 else "SPREAD",
            ),
            run_config=RunConfig(
                name=name,
                storage_path=str(storage),
                failure_config=FailureConfig(max_failures=0),
            ),
        )
        try:
            trainer.fit()
        except Exception as exc:  # Ray's TrainingFailedError (a rank's error, a lost node)
            raise RayRunFailed(f"the run on {shape} ended without finishing: {exc}") from exc
    finally:
        ray.shutdown()


def forwarded_env() -> dict[str, str]:
    """The part of this process's environment the ranks get (:data:`FORWARDED_ENV`), and its
    working folder (``DPRC_RAY_CWD``, which :func:`join_ray_rank` enters where it exists)."""
    import os

    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
    env["DPRC_RAY_CWD"] = os.getcwd()
    return env


def wait_for_address(address: str, wait_seconds: float) -> None:
    """Wait until the cluster's GCS at ``HOST:PORT`` takes a TCP connection."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"the Ray cluster's address must be HOST:PORT, got {address!r}")
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise NodesUnavailable(
                    f"cannot reach the Ray cluster at {address} (waited {wait_seconds:g} s): {exc}"
                ) from exc
        time.sleep(WAIT_POLL_SECONDS)


def nodes_with(devices: int, use_gpu: bool) -> list[str]:
    """The alive nodes of the connected cluster with at least ``devices`` devices."""
    import ray

    key = "GPU" if use_gpu else "CPU"
    return [
        node["NodeID"]
        for node in ray.nodes()
        if node.get("Alive") and node.get("Resources", {}).get(key, 0) >= devices
    ]


def wait_for_nodes(shape: Shape, use_gpu: bool, wait_seconds: float) -> None:
    """Wait until the cluster has ``shape.nodes`` nodes with ``shape.devices`` devices each."""
    deadline = time.monotonic() + wait_seconds
    while True:
        found = nodes_with(shape.devices, use_gpu)
        if len(found) >= shape.nodes:
            return
        if time.monotonic() >= deadline:
            kind = "GPUs" if use_gpu else "CPUs"
            raise NodesUnavailable(
                f"the job needs {shape} ({shape.devices} {kind} a node); the Ray cluster has "
                f"{len(found)} such node(s) (waited {wait_seconds:g} s)"
            )
        time.sleep(WAIT_POLL_SECONDS)


def join_ray_rank() -> None:
    """In a Ray Train worker: enter the caller's working folder (where this node has it) and
    put this rank on its device (Ray formed the process group)."""
    import os

    import torch

    cwd = os.environ.get("DPRC_RAY_CWD")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    if torch.cuda.is_available() and torch.distributed.get_backend() == "nccl":
        import ray.train.torch

        torch.cuda.set_device(ray.train.torch.get_device())


def placement() -> list[str]:
    """Every rank's node id (rank order), gathered on all ranks; call from every rank."""
    import ray
    import torch

    node = ray.get_runtime_context().get_node_id()
    nodes: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(nodes, node)
    return [str(n) for n in nodes]


def placement_line(nodes: list[str]) -> str:
    """``ranks on 2 nodes: 0 → 1a2b3c4d, 1 → 5e6f7a8b`` (short node ids)."""
    order: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        order.setdefault(node, []).append(rank)
    parts = [f"{','.join(map(str, ranks))} → {node[:8]}" for node, ranks in order.items()]
    return f"ranks on {len(order)} node(s): " + "; ".join(parts)
