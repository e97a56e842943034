"""Jobs on several hosts (``nodes: 2``, issue 46) through the official client: a service whose
worker launches through Ray (``DPRC_LAUNCHER=ray``, the local two-node cluster of
tests/ray_cluster.py) trains the job on a rank a node (gloo, CPU), rank 0 reporting through the
run folder both nodes reach; the job's plan is the one-process plan (``/v1/accountant/job_plan``
without nodes), its ledger holds each step once and the file's budget is charged once. SQLite
and PostgreSQL; a job on more hosts than the deployment launches is refused at creation."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.api.conftest import Server
from tests.worker.conftest import learnable_lines, serve_embedded, wait_for
from tests.worker.test_devices import _assert_exact_ledger
from worker.celery_app import queue_for

# slow; one process runs both modules of the "ray" group, which share one local cluster
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def two_nodes(request, tmp_path_factory, local_ray) -> Iterator[Server]:
    yield from serve_embedded(
        request,
        tmp_path_factory,
        "nodes",
        device="cpu",
        launcher="ray",
        ray_address=local_ray.address,
        max_job_nodes=2,
        ray_wait_seconds=120,
    )


def _body(file_id: str, **shape: int) -> dict:
    return {
        "model": "dprc-tiny-llama",
        "training_file": file_id,
        "hyperparameters": {"n_epochs": 2, "batch_size": 8, "learning_rate": 0.01,
                            "max_seq_len": 32},
        "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
        "checkpoint_every": 3,
        **shape,
    }  # fmt: skip


def test_a_two_node_job_trains_through_ray_with_the_one_process_plan(two_nodes):
    key = two_nodes.key("nodes")
    client = two_nodes.client(key)
    f = client.files.create(
        file=("train.jsonl", learnable_lines(32)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    body = _body(f.id)
    plan = httpx.post(
        f"{two_nodes.base_url}/v1/accountant/job_plan",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert plan.status_code == 200, plan.text
    want = plan.json()
    created = client.fine_tuning.jobs.create(
        model=body["model"],
        training_file=f.id,
        hyperparameters=body["hyperparameters"],
        extra_body={k: body[k] for k in ("privacy", "checkpoint_every")} | {"nodes": 2},
    )
    assert (created.model_extra["nodes"], created.model_extra["devices"]) == (2, 1)
    job = wait_for(client, created.id, TERMINAL, timeout=400)
    assert job.status == "succeeded", job.error
    priv = job.model_extra["privacy"]
    for key_name in ("noise_multiplier", "sample_rate", "steps", "planned_epsilon"):
        assert priv[key_name] == want[key_name], key_name  # the shape changes nothing planned
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    placed = [m for m in messages if m.startswith("Ranks placed by Ray")]
    assert len(placed) == 1 and "ranks on 2 node(s)" in placed[0], messages
    _assert_exact_ledger(client, job)
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0
    assert abs(budget["spent"] - priv["epsilon_spent"]) <= 1e-6  # charged once


def test_a_job_on_more_hosts_than_the_deployment_launches_is_refused(two_nodes, embedded):
    for server, nodes in ((two_nodes, 3), (embedded, 2)):  # max_job_nodes 2; launcher local
        client = server.client(server.key("too-many-nodes"))
        f = client.files.create(file=("train.jsonl", learnable_lines(16)), purpose="fine-tune")
        with pytest.raises(openai.BadRequestError) as err:
            client.fine_tuning.jobs.create(
                model="dprc-tiny-llama",
                training_file=f.id,
                extra_body={"privacy": {"target_epsilon": 8.0}, "nodes": nodes},
            )
        body = err.value.body
        assert isinstance(body, dict)
        assert body["code"] == "nodes_unavailable" and body["param"] == "nodes", body
        assert not client.fine_tuning.jobs.list().data


def test_a_worker_that_launches_through_ray_consumes_the_multi_node_queue():
    """Celery: jobs with nodes > 1 go to gpu-nodes, which only a worker launching through Ray
    consumes (the queue list a worker is started with, for its settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "worker.celery_app", "queues"]
    for extra, want in (
        ({}, "gpu"),
        ({"DPRC_WORKER_DEVICES": "2"}, "gpu,gpu-2"),
        (
            {"DPRC_LAUNCHER": "ray", "DPRC_RAY_ADDRESS": "ray-head:6379",
             "DPRC_MAX_JOB_NODES": "2"},
            "gpu,gpu-nodes",
        ),
    ):  # fmt: skip
        done = subprocess.run(
            cmd, env={**env, **extra}, cwd=root, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == want, (extra, done.stdout, done.stderr)
    assert queue_for(2, nodes=2) == queue_for(1, nodes=3) == "gpu-nodes"
