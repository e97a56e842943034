"""The frozen-after-restore rule (issue 30, part 5), end to end through uvicorn with the
embedded worker, on SQLite and on a PostgreSQL database of the test's own: a job runs, a
backup is taken, another job runs on the same data set; ``dprc admin restore`` brings back the
backup and freezes that data set (its ledger shows a job the backup does not know), not the
other one; creating a job on it is 409 ``budget_group_frozen`` with the reason; an admin
acknowledges it and a job runs again. ``dprc admin check`` passes on that state and finds an
edited ledger file and a budget below what its jobs commit."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from sqlalchemy import text

from service.base.settings import Settings
from service.store.db import make_engine
from tests.api.conftest import _settings, fresh_pg_database, run_cli, serving, text_lines
from tests.worker.conftest import learnable_lines, wait_for

HP = {"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32}
PRIVACY = {"privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}}}
ENDED = {"succeeded", "failed", "cancelled"}


@pytest.fixture(params=["sqlite", "postgresql"])
def volume(request, tmp_path, monkeypatch) -> Iterator[Settings]:
    """The server's settings (the embedded worker on), and the same store for ``dprc admin``."""
    data = tmp_path / "data"
    monkeypatch.setenv("DPRC_DATA_DIR", str(data))
    worker = {
        "embedded_worker": True,
        "lease_seconds": 6,
        "sweep_seconds": 2,
        "max_physical_batch_size": 8,
    }
    if request.param == "sqlite":
        monkeypatch.delenv("DPRC_DATABASE_URL", raising=False)
        yield _settings(data, None, **worker)
        return
    with fresh_pg_database("dprc_freeze") as url:
        monkeypatch.setenv("DPRC_DATABASE_URL", url)
        yield _settings(data, url, **worker)


def _run(client: openai.OpenAI, file_id: str):
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama", training_file=file_id, hyperparameters=HP, extra_body=PRIVACY
    )
    job = wait_for(client, job.id, ENDED)
    assert job.status == "succeeded", job.model_extra.get("error") or job
    return job


def test_jobs_after_a_backup_freeze_their_data_set_until_acknowledged(volume, tmp_path):
    backup = tmp_path / "backup"
    data_dir = volume.data_dir
    with serving(volume) as srv:
        admin = srv.key("freeze")
        client = srv.client(admin)
        budget = {"epsilon_budget": 20.0}
        f = client.files.create(
            file=("t.jsonl", learnable_lines(32)), purpose="fine-tune", extra_body=budget
        )
        other = client.files.create(
            file=("o.jsonl", text_lines(32)), purpose="fine-tune", extra_body=budget
        )
        group, other_group = f.model_extra["budget_group"], other.model_extra["budget_group"]
        first = _run(client, f.id)  # in the backup
        status, said, err = run_cli("admin", "backup", str(backup))
        assert status == 0, err
        assert "1 jobs, 2 data sets), 1 job ledgers" in said
        after = _run(client, f.id)  # not in the backup: its spending is unknown to it
        steps = after.model_extra["steps_done"]
        assert steps == 4

    status, said, err = run_cli("admin", "restore", str(backup), "--yes")
    assert status == 0, err
    assert f"after the backup: job {after.id} ran {steps} steps and is not in the backup" in said
    assert f"frozen: {group}: restored from the backup of " in said
    assert other_group not in said  # no job ran on it after the backup
    (aside,) = (data_dir / "ledgers").glob(f"restored-*/{after.id}.json")  # kept, set aside
    assert json.loads(aside.read_text())["steps_done"] == steps

    with serving(volume) as srv:
        client = srv.client(admin)
        assert client.fine_tuning.jobs.retrieve(first.id).status == "succeeded"
        with pytest.raises(openai.NotFoundError):
            client.fine_tuning.jobs.retrieve(after.id)
        with pytest.raises(openai.ConflictError) as refused:
            client.fine_tuning.jobs.create(
                model="dprc-tiny-llama", training_file=f.id, hyperparameters=HP, extra_body=PRIVACY
            )
        assert refused.value.code == "budget_group_frozen"
        message = refused.value.message
        assert f"data set {group} is frozen since" in message
        assert f"job {after.id} ran {steps} steps and is not in the backup" in message
        assert f"POST /v1/organization/budget_groups/{group}/acknowledge" in message
        with srv.http(admin) as http:
            url = "/v1/organization/budget_groups/{}/acknowledge"
            not_frozen = http.post(url.format(other_group), json={"reason": "x"})
            assert not_frozen.status_code == 409  # the other data set was never frozen
            ack = http.post(url.format(group), json={"reason": "budget lowered by the lost job"})
            assert ack.status_code == 200, ack.text
            assert ack.json()["frozen"] is False
        again = _run(client, f.id)

    status, said, err = run_cli("admin", "check")
    assert (status, said, err) == (0, "ok: 2 jobs, 2 ledger files, 2 data sets (0 frozen)\n", "")

    # an edited ledger file: the check names the job and what differs
    ledger = data_dir / "ledgers" / f"{again.id}.json"
    original = ledger.read_text()
    edited = json.loads(original)
    edited["steps_done"] -= 1
    ledger.write_text(json.dumps(edited))
    status, said, _ = run_cli("admin", "check")
    assert status == 1
    assert f"job {again.id}: ledger {again.id}.json: 3 steps, the database charges 4" in said
    ledger.write_text(original)
    # a budget below what the data set's jobs commit (changed behind the service's back)
    engine = make_engine(volume)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE budget_groups SET epsilon_budget = 0.5 WHERE id = :g"), {"g": group}
            )
    finally:
        engine.dispose()
    status, said, _ = run_cli("admin", "check")
    assert status == 1
    assert said.splitlines() == [
        line for line in said.splitlines() if line.startswith(f"data set {group}: ")
    ]
    assert "above its budget 0.5" in said
