"""A local Ray cluster of two "nodes" for the multi-node tests (issue 46): a head and a worker
node, each its own raylet with one CPU (so ``STRICT_SPREAD`` puts one rank on each), started
once a session on loopback through Ray's own ``ray.cluster_utils.Cluster``. Its processes get
the checkout on ``PYTHONPATH`` (the ranks import the test scenarios) and one thread each."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}


class LocalRay:
    """The cluster, and a way to kill its worker node and add a new one."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster: Any = Cluster(
            initialize_head=True, head_node_args={**NODE, "include_dashboard": False}
        )
        self.worker = self.cluster.add_node(**NODE)
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def kill_worker_node(self) -> None:
        """SIGKILL the worker node's raylet and its processes (a host that dies)."""
        self.cluster.remove_node(self.worker, allow_graceful=False)

    def add_worker_node(self) -> None:
        self.worker = self.cluster.add_node(**NODE)
        self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="session")
def local_ray() -> Iterator[LocalRay]:
    pytest.importorskip("ray", reason="the multi-node tests need ray (pip install 'dprc[ray]')")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_NUM_THREADS")}
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # offline: nothing reported anywhere
    try:
        cluster = LocalRay()
    finally:
        for key, value in saved.items():  # the nodes keep theirs; the session gets its own back
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        yield cluster
    finally:
        cluster.shutdown()
