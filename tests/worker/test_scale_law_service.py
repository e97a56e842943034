"""A service job is charged and run on one hidden-scale law (docs/accounting.md §10, "The
scale law's width"): the law the service planned is stored with the job (its planned event,
``privacy.event.scale_width``), shown on the job object (``privacy.accountant.scale_width``)
and passed to the runner by the worker's spec; a job stored before the law was recorded (no
key) is on the legacy 0.1 % law everywhere, and a runner reporting another law than the one
charged fails the job. On SQLite and PostgreSQL, through uvicorn (no worker runs: the jobs
stay queued)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from dprc_core.accounting import epsilon_for_events
from dprc_core.accounting.events import SubsampledGaussianEvent
from service.admin.consistency import _same_events
from service.budget import budget
from service.jobs import job_runs as runs
from service.store.tables import Job as JobRow
from tests.api.conftest import Server, _serve, _settings, text_lines
from worker.execution import build_spec

N = 200
HP = {"n_epochs": 1, "batch_size": 20}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def queued(request, tmp_path_factory) -> Iterator[Server]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    tmp = tmp_path_factory.mktemp(f"dprc-law-{request.param}")
    yield from _serve(_settings(tmp, url))


def _create(server: Server, sketch: str) -> tuple[str, dict]:
    client = server.client(server.key("law"))
    f = client.files.create(file=("t.jsonl", text_lines(N)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters=HP,
        extra_body={
            "privacy": {"target_epsilon": 3.0, "clipping": {"method": "hutch", "sketch": sketch}}
        },
    )
    return job.id, job.model_extra["privacy"]


def _row(server: Server, job_id: str) -> JobRow:
    with server.store.sessions() as session:
        row = session.scalar(select(JobRow).where(JobRow.id == job_id))
        assert row is not None
        session.expunge(row)
        return row


def test_a_job_is_stored_shown_and_run_on_the_law_it_was_charged(queued):
    job_id, priv = _create(queued, "per_example")
    assert priv["accountant"]["scale_width"] == 0.01
    row = _row(queued, job_id)
    assert row.privacy["event"]["scale_width"] == 0.01
    planned = budget.planned_event(row)
    assert isinstance(planned, SubsampledGaussianEvent) and planned.scale_width == 0.01
    # the ε the job states is the ε of the event it is charged, on that law, at its σ
    q, steps = priv["sample_rate"], priv["steps"]
    event = SubsampledGaussianEvent(
        priv["noise_multiplier"], q, steps, "hutch", 32, None, "per_example", 0.01
    )
    assert planned == event
    assert priv["planned_epsilon"] == pytest.approx(
        epsilon_for_events([event], priv["target_delta"]), rel=1e-12
    )
    assert priv["planned_epsilon"] <= 3.0
    spec = build_spec(queued.store, runs.job_request(queued.store, job_id))
    assert spec.scale_width == 0.01
    # the runner reporting the charged law: nothing to change; another law: the job fails
    assert not runs.record_accounting(queued.store, job_id, "hutch", "per_example", 0.01)
    with pytest.raises(runs.AccountingMismatch, match="scale_width=0.001"):
        runs.record_accounting(queued.store, job_id, "hutch", "per_example", 0.001)

    shared_id, shared = _create(queued, "shared")
    assert "scale_width" not in shared["accountant"]
    assert "scale_width" not in _row(queued, shared_id).privacy["event"]
    assert build_spec(queued.store, runs.job_request(queued.store, shared_id)).scale_width is None


def test_a_job_stored_before_the_law_keeps_the_legacy_law(queued):
    job_id, priv = _create(queued, "per_example")
    # the row as the service stored it before the law was recorded
    with queued.store.sessions() as session:
        row = session.scalar(select(JobRow).where(JobRow.id == job_id))
        assert row is not None
        privacy = dict(row.privacy)
        privacy["event"] = {k: v for k, v in privacy["event"].items() if k != "scale_width"}
        privacy["accountant"] = {
            k: v for k, v in privacy["accountant"].items() if k != "scale_width"
        }
        row.privacy = privacy
        session.commit()
    row = _row(queued, job_id)
    legacy = budget.planned_event(row)
    assert isinstance(legacy, SubsampledGaussianEvent) and legacy.scale_width == 0.001
    client = queued.client(queued.key("law"))
    shown = client.fine_tuning.jobs.retrieve(job_id).model_extra["privacy"]
    assert shown["accountant"]["scale_width"] == 0.001
    assert build_spec(queued.store, runs.job_request(queued.store, job_id)).scale_width == 0.001
    with pytest.raises(runs.AccountingMismatch, match="scale_width=0.01"):
        runs.record_accounting(queued.store, job_id, "hutch", "per_example", 0.01)
    assert not runs.record_accounting(queued.store, job_id, "hutch", "per_example", 0.001)
    # a ledger file of that time (its events without the law) is the database's event; one on
    # another law is not
    assert _same_events([row.privacy["event"]], [legacy])
    assert not _same_events([{**row.privacy["event"], "scale_width": 0.01}], [legacy])
    assert _same_events([legacy.to_dict()], [legacy])
