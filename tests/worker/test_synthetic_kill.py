"""A synthetic-data job whose worker is killed with SIGKILL at each of its state transitions:
right after it took the job (running, nothing drawn), right after the label histogram was
recorded, after its first batch of records, and while its records were being copied into the
data set (before the transaction that ends the job). The next worker takes the job over once
the lease expires, and the job ends with: the histogram drawn and charged once (the one
recorded before the kill is the one used), exactly ``n`` records, one result data set, and the
group's committed ε equal to the composition of the fine-tuning and that one histogram.

Each worker is a child process (``execute_job``, the task code of the embedded and Celery
workers) whose fault is injected in the child only: the function after which it dies is
wrapped to send itself SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import Server, _serve, _settings
from tests.worker.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
HP = {"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32}

CHILD = r"""
import json, os, shutil, signal, sys
from service.base.settings import Settings
from service.store.store import open_store
from service.synthetic import synthetic_runs
from worker.execution import execute_job

settings, job_id, point = Settings(**json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]

def die(*_):
    os.kill(os.getpid(), signal.SIGKILL)

def after(module, name, calls=1):
    original, seen = getattr(module, name), [0]
    def wrapped(*a, **k):
        out = original(*a, **k)
        seen[0] += 1
        if seen[0] >= calls:
            die()
        return out
    setattr(module, name, wrapped)

if point == "claimed":
    after(synthetic_runs, "claim")
elif point == "released":
    after(synthetic_runs, "release_histogram")
elif point == "batch":
    after(synthetic_runs, "renew", calls=2)
elif point == "copied":
    after(shutil, "copyfile")
print(execute_job(open_store(settings), job_id, owner=f"child-{point}-{os.getpid()}"))
"""


@pytest.fixture(scope="module")
def quiet(tmp_path_factory) -> Iterator[Server]:
    """SQLite, no embedded worker: the test's child processes are the workers."""
    tmp = tmp_path_factory.mktemp("dprc-synth-kill")
    yield from _serve(_settings(tmp, None, lease_seconds=2, max_physical_batch_size=8))


def _worker(server: Server, job_id: str, point: str = "none") -> int:
    settings = server.settings.model_dump(mode="json")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(settings), job_id, point],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if point == "none":
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.returncode


@pytest.mark.parametrize("point", ["claimed", "released", "batch", "copied"])
def test_a_killed_synthetic_worker_is_taken_over_and_charges_once(quiet, point):
    client = quiet.client(quiet.key(f"kill {point}"))
    rows = [
        {"text": f"note {i} is {'up' if i % 3 else 'down'}", "label": "up" if i % 3 else "down"}
        for i in range(48)
    ]
    data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    f = client.files.create(
        file=("n.jsonl", data), purpose="fine-tune", extra_body={"epsilon_budget": 20}
    )
    job = client.post(
        "/synthetic_data/jobs",
        body={
            "n": 40,
            "training_file": f.id,
            "fine_tuning": {
                "model": "dprc-tiny-llama",
                "hyperparameters": HP,
                "privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}},
            },
            "label_epsilon": 1.0,
            "sampling": {"max_tokens": 6},
            "seed": 3,
        },
        cast_to=object,
    )
    _worker(quiet, job["fine_tuning_job"])  # the fine-tuning, uninterrupted
    assert wait_for(client, job["fine_tuning_job"], {"succeeded"}, timeout=5)
    assert _worker(quiet, job["id"], point) == -signal.SIGKILL
    middle = client.get(f"/synthetic_data/jobs/{job['id']}", cast_to=object)
    assert middle["status"] == "running"
    drawn = middle["privacy"]["label_histogram"]
    assert (drawn is None) == (point == "claimed")
    time.sleep(2.5)  # the dead worker's lease expires
    _worker(quiet, job["id"])
    done = client.get(f"/synthetic_data/jobs/{job['id']}", cast_to=object)
    assert done["status"] == "succeeded", (done["error"], done["status"])
    if drawn is not None:
        assert done["privacy"]["label_histogram"] == drawn  # the recorded draw, not a new one
    log = client.get(f"/synthetic_data/jobs/{job['id']}/events", cast_to=object)["data"]
    assert sum("Released the label histogram" in e["message"] for e in log) == 1
    results = [x for x in client.files.list().data if x.model_extra.get("synthetic")]
    assert [x.id for x in results] == [done["result_file"]]
    lines = client.files.content(done["result_file"]).text.splitlines()
    assert len(lines) == 40
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["committed"] == pytest.approx(done["privacy"]["epsilon"], rel=1e-9)


def test_a_histogram_drawn_after_a_backup_is_evidence_for_its_restore(quiet, tmp_path):
    """The release is one step of the job's ledger: a backup taken before it does not hold it
    (``dprc admin restore`` of that backup finds it and freezes the data set), a backup taken
    after it does (no evidence), and ``dprc admin check`` finds the ledger and the database in
    agreement."""
    from service.admin.backup import backup
    from service.admin.consistency import check
    from service.admin.restore import find_evidence

    client = quiet.client(quiet.key("restore"))
    rows = [{"text": f"item {i} {'red' if i % 2 else 'blue'}", "label": i % 2} for i in range(32)]
    data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    f = client.files.create(
        file=("r.jsonl", data), purpose="fine-tune", extra_body={"epsilon_budget": 20}
    )
    job = client.post(
        "/synthetic_data/jobs",
        body={
            "n": 3,
            "training_file": f.id,
            "fine_tuning": {
                "model": "dprc-tiny-llama",
                "hyperparameters": HP,
                "privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}},
            },
            "sampling": {"max_tokens": 4},
        },
        cast_to=object,
    )
    _worker(quiet, job["fine_tuning_job"])
    before = backup(quiet.store, tmp_path / "before")
    _worker(quiet, job["id"])
    assert client.get(f"/synthetic_data/jobs/{job['id']}", cast_to=object)["status"] == "succeeded"
    group = client.files.retrieve(f.id).model_extra["budget_group"]
    evidence, _ = find_evidence(tmp_path / "before", before, quiet.settings.data_dir)
    assert [(e.job_id, e.group) for e in evidence] == [(job["id"], group)]
    after = backup(quiet.store, tmp_path / "after")
    evidence, _ = find_evidence(tmp_path / "after", after, quiet.settings.data_dir)
    assert evidence == []
    report = check(quiet.store)
    assert not [p for p in report.problems if "synth" in p], report.problems
