"""Operations (issue 30, part 6), through uvicorn with the embedded worker on SQLite and
PostgreSQL: ``DPRC_KEEP_CHECKPOINTS`` keeps a finished job's last checkpoints and never its
privacy record; ``GET /v1/me`` shows the tenant's storage; ``/readyz`` checks the database, the
migrations and the broker."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from sqlalchemy import text

from dprc_core.training.checkpoint import list_checkpoints
from service.data.private_data import run_folder
from service.store.db import migrations_at_head
from tests.api.conftest import Server, _serve, _settings
from tests.worker.conftest import learnable_lines, serve_embedded, wait_for

HP = {"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32}
PRIVACY = {"privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}}}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "ops", keep_checkpoints=2)


def test_a_finished_job_keeps_its_last_checkpoints_and_all_its_privacy_record(served):
    key = served.key(f"ops {served.settings.data_dir.name}")
    client = served.client(key)
    data = learnable_lines(32)
    f = client.files.create(
        file=("t.jsonl", data), purpose="fine-tune", extra_body={"epsilon_budget": 9.0}
    )
    with served.http(key) as http:
        me = http.get("/v1/me").json()
    assert me["storage"] == {
        "used_bytes": len(data),
        "quota_bytes": served.settings.tenant_storage_bytes,
    }
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters=HP,
        extra_body={**PRIVACY, "checkpoint_every": 1},
    )
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.model_extra.get("error") or job
    steps = job.model_extra["steps_done"]
    assert steps == 4  # ⌈32 / 8⌉, a checkpoint at each

    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert sorted(c.step_number for c in ckpts) == [3, 4]  # the last two, the final among them
    # the bytes go right after the commit that ends the job (retention.py), so a client that
    # sees "succeeded" may look before the worker has removed them: a few seconds at most
    run = run_folder(served.settings.data_dir, job.id)
    deadline = time.monotonic() + 30
    while (on_disk := sorted(p.name for p in list_checkpoints(run))) != [
        "step-000003",
        "step-000004",
    ] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert on_disk == ["step-000003", "step-000004"]
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    saved = [e for e in events if e.message.startswith("Checkpoint at step")]
    assert len(saved) == 4  # the events of the removed checkpoints stay
    archives = {client.files.retrieve(r).filename: r for r in job.result_files}
    removed = [archives[f"{job.id}-step-{s}.tar"] for s in (1, 2)]
    for file_id in removed:
        with pytest.raises(openai.NotFoundError):
            client.files.content(file_id)
        assert client.files.retrieve(file_id).model_extra["deleted"] is True
    # the privacy record: the ledger, the job's ε and the data set's spent are untouched
    ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert sum(e["steps"] for e in ledger["ledger"]["events"]) == steps
    assert ledger["epsilon_spent"] == job.model_extra["privacy"]["epsilon_spent"] > 0
    assert client.files.retrieve(f.id).model_extra["budget"]["spent"] > 0
    # storage counts what is kept: the upload, the two kept archives and the results CSV
    kept = [r for r in job.result_files if r not in removed]
    assert len(kept) == 3
    with served.http(key) as http:
        used = http.get("/v1/me").json()["storage"]["used_bytes"]
    assert used == len(data) + sum(client.files.retrieve(i).bytes for i in kept)


def test_readyz_checks_the_database_migrations_and_broker(served, tmp_path):
    with served.http(None) as http:
        r = http.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["checks"] == {"store": "ok", "migrations": "ok"}
    # a database behind the code's migrations: not ready, and it says so
    _, _, head = migrations_at_head(served.store.engine)
    with served.store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0004'"))
    try:
        with served.http(None) as http:
            r = http.get("/readyz")
            assert r.status_code == 503
            assert r.json()["checks"]["migrations"] == f"error: at 0004, the code needs {head}"
            assert http.get("/healthz").status_code == 200  # liveness is not readiness
    finally:
        with served.store.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": head})
    # a configured broker that does not answer (stopped): not ready
    stopped = _settings(tmp_path, None).model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    for srv in _serve(stopped):
        with srv.http(None) as http:
            r = http.get("/readyz")
            assert r.status_code == 503 and r.json()["checks"]["broker"].startswith("error")
            assert r.json()["checks"]["store"] == "ok"
