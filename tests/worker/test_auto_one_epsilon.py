"""One ε per job on every surface when ``auto`` resolves to exact norms (issue 33.1).

The service plans ``auto`` as ``hutch`` (it has no model at creation); on the tiny Llama at
``max_seq_len`` 16 the engine resolves every layer to an exact norm, so the mechanism that runs
is exact clipping. The job, its events, checkpoints, results CSV, the API's ledger, the
released ``ledger.json`` and the data set's budget must all say the exact ε of the steps that
ran — the accountant's, recomputed here — on SQLite and on PostgreSQL, with the embedded worker
(the same task code as Celery)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator

import pytest

from dprc_core.accounting import PrivacyLedger, epsilon
from dprc_core.engine import layer_methods
from dprc_core.training.models import load_model
from dprc_core.training.results import read_results
from service.models.model_registry import registry
from tests.api.conftest import Server
from tests.worker.conftest import learnable_lines, serve_embedded, wait_for

MAX_SEQ_LEN = 16


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "auto")


def _archive_ledger(client, file_id: str) -> PrivacyLedger:
    archive = client.files.content(file_id).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("ledger.json")
        assert member is not None
        return PrivacyLedger.from_json(member.read().decode())


def test_an_auto_job_that_runs_exact_norms_has_one_epsilon_everywhere(served):
    client = served.client(served.key("auto-one-eps"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(24)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={
            "n_epochs": 1,
            "batch_size": 8,
            "learning_rate": 0.01,
            "max_seq_len": MAX_SEQ_LEN,
        },
        extra_body={"privacy": {"target_epsilon": 4.0, "clipping": {"method": "auto"}}},
    )
    created = job.model_extra["privacy"]
    # at creation: planned as hutch (the conservative plan of an unresolved auto)
    assert created["accountant"]["clipping"] == "hutch"
    sigma, q, steps = created["noise_multiplier"], created["sample_rate"], created["steps"]
    delta = created["target_delta"]
    hutch_planned = created["planned_epsilon"]
    assert hutch_planned == pytest.approx(
        epsilon(sigma, q, steps, delta, "hutch", created["accountant"]["k"], sketch="per_example"),
        rel=1e-6,
    )

    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.model_extra.get("error") or job
    assert job.model_extra["steps_done"] == steps == 3  # ⌈24 / 8⌉

    # the independent facts: the engine's resolution on this model, and exact clipping's ε
    folder = registry(served.settings).get("dprc-tiny-llama")
    assert folder is not None and folder.ready
    model = load_model(folder.path, "causal_lm")
    resolved = set(layer_methods(model, "auto", 32, MAX_SEQ_LEN).values())
    assert resolved and "hutch" not in resolved, resolved
    want = epsilon(sigma, q, steps, delta, "exact", None)
    assert want < hutch_planned

    priv = job.model_extra["privacy"]
    assert priv["epsilon_spent"] == pytest.approx(want, rel=1e-9)
    assert priv["planned_epsilon"] == pytest.approx(want, rel=1e-6)
    assert priv["accountant"]["clipping"] == "exact"
    assert priv["accountant"]["sketch"] == "shared"

    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    said = [e for e in events if e.message.startswith("Every layer resolved to exact norms")]
    assert len(said) == 1  # said once
    assert said[0].data["charged_before"] == pytest.approx(hutch_planned)
    progress = sorted(
        (e.data for e in events if e.message.startswith("Step ")), key=lambda d: d["step"]
    )
    assert progress[-1]["step"] == steps
    assert progress[-1]["epsilon_spent"] == pytest.approx(want, rel=1e-9)

    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    last = max(ckpts, key=lambda c: c.step_number)
    assert last.step_number == steps
    assert last.model_extra["epsilon"] == pytest.approx(want, rel=1e-9)
    run_ledger = _archive_ledger(client, last.model_extra["file_id"])
    assert {e.envelope for e in run_ledger.events} == {"exact"}
    assert run_ledger.epsilon(delta) == pytest.approx(want, rel=1e-9)

    results = [f for f in job.result_files if f not in {c.model_extra["file_id"] for c in ckpts}]
    assert len(results) == 1
    rows = read_results(client.files.content(results[0]).text)
    assert rows[-1]["step"] == steps
    assert rows[-1]["epsilon"] == pytest.approx(want, rel=1e-9)

    ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert ledger["epsilon_spent"] == pytest.approx(want, rel=1e-9)
    assert [e["clipping"] for e in ledger["ledger"]["events"]] == ["exact"]  # the JSON's name

    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0
    assert budget["spent"] == pytest.approx(
        epsilon(sigma, q, steps, budget["delta"], "exact", None), rel=1e-3
    )
    assert budget["committed"] == pytest.approx(budget["spent"])
    json.dumps(ledger)  # the API's ledger is plain JSON
