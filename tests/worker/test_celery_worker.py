"""Real Celery worker processes on the real Redis broker and PostgreSQL: a job end to end,
a worker killed with SIGKILL mid-job (the next worker resumes from the last checkpoint), and
the same job delivered twice to two live workers (it trains once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dprc_core.accounting import PrivacyLedger, epsilon
from tests.api.conftest import Server, _serve, _settings
from tests.worker.conftest import learnable_lines, wait_for

REDIS_URL = os.environ.get("DPRC_TEST_REDIS", "redis://127.0.0.1:6379/11")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker() -> str:
    try:
        redis.Redis.from_url(REDIS_URL).flushdb()  # a database of its own: no stale messages
    except redis.ConnectionError as exc:  # fail, never skip: the suite needs Redis
        pytest.fail(f"Redis is not reachable at {REDIS_URL} (run scripts/services.sh): {exc}")
    return REDIS_URL


@pytest.fixture(scope="module")
def celery_server(pg_url, broker, tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("dprc-celery")
    yield from _serve(
        _settings(
            tmp,
            pg_url,
            broker_url=broker,
            lease_seconds=4,
            sweep_seconds=2,
            max_physical_batch_size=8,
        )
    )


class Workers:
    def __init__(self, server: Server):
        self.server = server
        self.procs: list[subprocess.Popen] = []

    def start(self, queues: str = "gpu", **env_extra: str) -> subprocess.Popen:
        """A real Celery worker on ``queues``, with ``env_extra`` (DPRC_* settings) added."""
        s = self.server.settings
        env = {
            **os.environ,
            "DPRC_DATA_DIR": str(s.data_dir),
            "DPRC_DATABASE_URL": s.database_url or "",
            "DPRC_BROKER_URL": s.broker_url or "",
            "DPRC_LEASE_SECONDS": "4",
            "DPRC_SWEEP_SECONDS": "2",
            "DPRC_MAX_PHYSICAL_BATCH_SIZE": "8",
            "PYTHONUNBUFFERED": "1",
            **env_extra,
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "worker.celery_app",
                "worker",
                "-Q",
                queues,
                "--pool",
                "solo",
                "--concurrency",
                "1",
                "--prefetch-multiplier",
                "1",
                "--without-gossip",
                "--without-mingle",
                "-l",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture()
def workers(celery_server) -> Iterator[Workers]:
    w = Workers(celery_server)
    yield w
    w.stop_all()


def _job(client, file_id: str, epochs: int, checkpoint_every: int):
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
        },
    )


def _started_events(client, job_id: str) -> list[str]:
    events = client.fine_tuning.jobs.list_events(job_id, limit=100).data
    return [e.message for e in events if e.message.startswith("Job started")]


def _ledger_of_last_checkpoint(client, job_id: str, tmp_path: Path) -> PrivacyLedger:
    import io
    import tarfile

    ckpts = client.fine_tuning.jobs.checkpoints.list(job_id).data
    last = max(ckpts, key=lambda c: c.step_number)
    data = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return PrivacyLedger.from_json(tar.extractfile("ledger.json").read())


def test_a_worker_killed_mid_job_is_replaced_and_the_job_resumes(celery_server, workers, tmp_path):
    client = celery_server.client(celery_server.key("crash"))
    f = client.files.create(file=("train.jsonl", learnable_lines(48)), purpose="fine-tune")
    first = workers.start()
    job = _job(client, f.id, epochs=5, checkpoint_every=5)  # 30 steps
    deadline = time.monotonic() + 300
    while client.fine_tuning.jobs.retrieve(job.id).model_extra["steps_done"] < 7:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    workers.kill(first)  # SIGKILL: no clean-up, the lease just stops being renewed
    killed_at = client.fine_tuning.jobs.retrieve(job.id).model_extra["steps_done"]
    assert killed_at < 30
    workers.start()  # its sweep finds the expired lease and resumes from the checkpoint
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"}, timeout=400)
    assert job.status == "succeeded", job.error
    assert len(_started_events(client, job.id)) == 2  # attempt 1 and the resumed attempt 2
    events = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    resumed = [m for m in events if m.startswith("Resuming from the checkpoint at step ")]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) in (5, 10), resumed
    steps = sorted(c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data)
    assert steps[-1] == 30 and len(steps) == len(set(steps))
    ledger = _ledger_of_last_checkpoint(client, job.id, tmp_path)
    assert sum(e.steps for e in ledger.events) == 30  # each step of the chain exactly once
    priv = job.model_extra["privacy"]
    # a no-crash run of this plan has ε = the accountant's ε for (σ, q, 30 steps)
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        30,
        priv["target_delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert abs(ledger.epsilon(priv["target_delta"]) - want) <= 1e-9 * want
    assert abs(priv["epsilon_spent"] - want) <= 1e-9 * want


def test_the_same_job_delivered_twice_to_two_workers_trains_once(celery_server, workers):
    from worker.celery_app import enqueue, make_celery

    client = celery_server.client(celery_server.key("twice"))
    f = client.files.create(file=("train.jsonl", learnable_lines(48)), purpose="fine-tune")
    job = _job(client, f.id, epochs=2, checkpoint_every=4)  # queued: no worker yet
    enqueue(make_celery(celery_server.settings), job.id)  # a second delivery of the same job
    workers.start()
    workers.start()
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"}, timeout=400)
    assert job.status == "succeeded", job.error
    assert len(_started_events(client, job.id)) == 1
    steps = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert sorted(steps) == [4, 8, 12]


@pytest.mark.parametrize("ask", ["cancel", "pause"])
def test_a_request_pending_when_its_worker_died_is_carried_out(celery_server, workers, ask):
    """Cancel (or pause) asked of a running job whose worker was just killed with SIGKILL:
    the request is pending, the lease expires, and the next worker's sweep carries it out —
    cancelled with the reservation settled to the steps that ran, or paused (resumable) —
    instead of leaving the job running for ever with its whole reservation held."""
    client = celery_server.client(celery_server.key(f"died-{ask}"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 20.0},
    )
    first = workers.start()
    job = _job(client, f.id, epochs=5, checkpoint_every=5)  # 30 steps
    deadline = time.monotonic() + 300
    while client.fine_tuning.jobs.retrieve(job.id).model_extra["steps_done"] < 6:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    workers.kill(first)  # the window: running, lease still live, nobody will act on requests
    asked = getattr(client.fine_tuning.jobs, ask)(job.id)
    assert asked.status == "running" and asked.model_extra[f"{ask}_requested"] is True
    done = asked.model_extra["steps_done"]
    assert done < 30
    workers.start()  # its sweep finds the expired lease with the request pending
    ended = wait_for(client, job.id, {"cancelled", "paused", "succeeded", "failed"}, timeout=120)
    assert ended.status == {"cancel": "cancelled", "pause": "paused"}[ask]
    assert ended.model_extra["steps_done"] == done  # nothing ran after the request
    assert len(_started_events(client, job.id)) == 1  # it was not restarted
    priv = ended.model_extra["privacy"]
    budget = client.files.retrieve(f.id).model_extra["budget"]
    ran = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        done,
        budget["delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    if ask == "cancel":
        assert budget["spent"] == pytest.approx(ran, rel=1e-9)
        assert budget["committed"] == pytest.approx(ran, rel=1e-9)  # the reservation released
        assert client.files.delete(f.id).deleted  # no longer in use
        return
    planned = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        30,
        budget["delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert budget["committed"] == pytest.approx(planned, rel=1e-9)  # a paused job keeps it
    client.fine_tuning.jobs.resume(job.id)
    finished = wait_for(client, job.id, {"succeeded", "failed", "cancelled"}, timeout=400)
    assert finished.status == "succeeded", finished.error
    ledger = _ledger_of_last_checkpoint(client, job.id, Path("."))
    assert sum(e.steps for e in ledger.events) == 30  # each step of the chain exactly once
