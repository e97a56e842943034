"""Jobs on several devices (``devices: 2``): the worker runs their ranks under torchrun (gloo on
this CPU), keeps the lease, records rank 0's progress; a SIGKILLed rank ends the attempt and a
new one resumes from the checkpoint with the ledger exact and ε the plan's. Embedded (SQLite)
and Celery (PostgreSQL, Redis) workers; a job no worker fits is refused at creation."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import openai
import pytest

from dprc_core.accounting import PrivacyLedger, epsilon
from tests.dprc_core.distributed.processes import rank_pids
from tests.worker.conftest import learnable_lines, wait_for
from tests.worker.test_celery_worker import broker, celery_server, workers  # noqa: F401

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "cancelled"}
TWO_DEVICES = {  # a Celery worker's settings: 2 CPU devices per job
    "DPRC_WORKER_DEVICES": "2",
    "DPRC_DEVICE": "cpu",
    "DPRC_MAX_PHYSICAL_BATCH_SIZE": "4",
}


def _create(
    client,
    file_id: str,
    devices: int,
    epochs: int = 2,
    checkpoint_every: int = 4,
    sharding: str = "none",
):
    return client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=file_id,
        hyperparameters={
            "n_epochs": epochs,
            "batch_size": 8,
            "learning_rate": 0.01,
            "max_seq_len": 32,
        },
        extra_body={
            "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
            "checkpoint_every": checkpoint_every,
            "devices": devices,
            **({"sharding": sharding} if sharding != "none" else {}),
        },
    )


def _assert_exact_ledger(client, job) -> None:
    priv = job.model_extra["privacy"]
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    last = max(ckpts, key=lambda c: c.step_number)
    assert last.step_number == priv["steps"]
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("ledger.json")
        assert member is not None
        ledger = PrivacyLedger.from_json(member.read().decode())
    assert sum(e.steps for e in ledger.events) == priv["steps"]  # each step once
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        priv["steps"],
        priv["target_delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert abs(priv["epsilon_spent"] - want) <= 1e-9 * want
    assert abs(priv["planned_epsilon"] - want) <= 1e-9 * want


def test_a_job_asking_for_more_devices_than_any_worker_has_is_refused(two_devices):
    client = two_devices.client(two_devices.key("too-many"))
    f = client.files.create(file=("train.jsonl", learnable_lines(16)), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, f.id, devices=3)
    body = err.value.body
    assert isinstance(body, dict)
    assert body["code"] == "devices_unavailable" and body["param"] == "devices"
    assert not client.fine_tuning.jobs.list().data  # nothing was created


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_a_two_device_job_survives_a_killed_rank(two_devices, sharding):
    """Data-parallel, and FSDP2-sharded (each rank's private state resumed from the
    checkpoint's resume/rank-<r>/)."""
    client = two_devices.client(two_devices.key(f"ranks-{sharding}"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    job = _create(client, f.id, devices=2, epochs=4, checkpoint_every=3, sharding=sharding)
    assert (job.model_extra["devices"], job.model_extra["sharding"]) == (2, sharding)
    deadline = time.monotonic() + 240
    while not client.fine_tuning.jobs.checkpoints.list(job.id).data:
        now = client.fine_tuning.jobs.retrieve(job.id)
        assert now.status not in TERMINAL, now
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ranks = rank_pids(os.getpid())
    assert set(ranks) == {0, 1}, ranks
    os.kill(ranks[1], signal.SIGKILL)
    job = wait_for(client, job.id, TERMINAL, timeout=300)
    assert job.status == "succeeded", job.error
    for pid in ranks.values():  # the first attempt left no process behind
        assert not Path(f"/proc/{pid}").exists()
    assert not rank_pids(os.getpid())
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    assert any(m.startswith("A rank ended early") for m in messages)
    assert any(m.startswith("Resuming from the checkpoint at step") for m in messages)
    _assert_exact_ledger(client, job)
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0
    assert abs(budget["spent"] - job.model_extra["privacy"]["epsilon_spent"]) <= 1e-6


def test_a_celery_worker_killed_mid_job_leaves_no_rank_and_another_resumes(
    celery_server,  # noqa: F811
    workers,  # noqa: F811
):
    env = {**os.environ, "DPRC_WORKER_DEVICES": "2"}
    queues = subprocess.run(
        [sys.executable, "-m", "worker.celery_app", "queues"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert queues == "gpu,gpu-2"
    celery_server.settings.max_job_devices = 2  # the API knows a 2-device worker exists
    first = workers.start(queues, **TWO_DEVICES)
    try:
        client = celery_server.client(celery_server.key("celery-ddp"))
        f = client.files.create(file=("train.jsonl", learnable_lines(32)), purpose="fine-tune")
        job = _create(client, f.id, devices=2, epochs=4, checkpoint_every=3)
        deadline = time.monotonic() + 240
        while not client.fine_tuning.jobs.checkpoints.list(job.id).data:
            assert client.fine_tuning.jobs.retrieve(job.id).status not in TERMINAL
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ranks = rank_pids(first.pid)
        assert set(ranks) == {0, 1}, ranks
        workers.kill(first)  # kill -9 the worker: its ranks must not run on
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in ranks.values()):
            assert time.monotonic() < deadline, "a rank outlived its worker"
            time.sleep(0.1)
        workers.start(queues, **TWO_DEVICES)
        job = wait_for(client, job.id, TERMINAL, timeout=300)
        assert job.status == "succeeded", job.error
        messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
        assert any(m.startswith("Resuming from the checkpoint at step") for m in messages)
        _assert_exact_ledger(client, job)
    finally:  # the workers fixture stops the workers
        celery_server.settings.max_job_devices = None
