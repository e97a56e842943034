"""``sharding: "fsdp"`` through the service (issue 29): a job on N ≥ 2 devices may ask for its
model to be sharded over its ranks (FSDP2). Driven by the official ``openai`` client over
uvicorn, on SQLite and PostgreSQL: the refusals (one device, ν-DP-FTRL, an unknown value) with
their codes, the job object's ``sharding`` next to ``devices``, an unchanged privacy plan,
Idempotency-Key fingerprints of requests that do not name ``sharding`` as before it existed, the
worker's spec, and migration 0009. Slow: a 2-device FSDP job in the embedded worker (SQLite, CPU
ranks) runs to ``succeeded``, is charged its plan's ε, and its last checkpoint loads whole."""

from __future__ import annotations

import io
import json
import tarfile
import typing
import uuid
from collections.abc import Iterator

import openai
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.jobs.schemas import JobCreate, ShardingName
from api.jobs.views import job_object, request_hash
from dprc_core.accounting import PrivacyLedger, epsilon
from dprc_core.sharding import SHARDINGS
from dprc_core.training.runner import JobSpec
from service.base.settings import Settings
from service.data.private_data import run_folder
from service.jobs import job_runs
from service.models.model_registry import registry
from service.store.db import make_engine, upgrade
from tests.api.conftest import PG_ADMIN, Server, _pg_admin_conn, _serve, _settings
from tests.migration_steps import migrate
from tests.worker.conftest import learnable_lines, wait_for
from worker.execution import build_spec

TERMINAL = {"succeeded", "failed", "cancelled"}
HP = {"n_epochs": 2, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32}
NU_DPFTRL = {
    "target_epsilon": 8.0,
    "clipping": {"method": "exact"},
    "noise": {"mechanism": "nu_dpftrl", "nu": 0.1},
}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(request, tmp_path_factory) -> Iterator[Server]:
    """The API (no worker: jobs stay queued) of a service whose largest worker has 2
    devices."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    tmp = tmp_path_factory.mktemp(f"dprc-sharding-{request.param}")
    yield from _serve(_settings(tmp, url, max_job_devices=2))


def _create(client: openai.OpenAI, file_id: str, privacy: dict | None = None, **extra):
    return client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=file_id,
        hyperparameters=HP,
        extra_body={
            "privacy": privacy or {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
            **extra,
        },
    )


def _refusal(err: pytest.ExceptionInfo) -> dict:
    body = err.value.body
    assert isinstance(body, dict), body
    return body


def test_the_api_offers_the_runners_shardings():
    assert typing.get_args(ShardingName) == SHARDINGS


def test_fsdp_is_refused_on_one_device_with_nu_dpftrl_and_unknown_values(service):
    client = service.client(service.key(f"refusals-{uuid.uuid4().hex[:6]}"))
    f = client.files.create(file=("t.jsonl", learnable_lines(32)), purpose="fine-tune")

    for devices in ({}, {"devices": 1}):  # the default and an explicit one device
        with pytest.raises(openai.BadRequestError) as err:
            _create(client, f.id, sharding="fsdp", **devices)
        body = _refusal(err)
        assert (body["code"], body["param"]) == ("sharding_needs_devices", "sharding")
        assert "devices >= 2" in body["message"] and "devices=1" in body["message"]

    with pytest.raises(openai.BadRequestError) as err:
        _create(client, f.id, NU_DPFTRL, sharding="fsdp", devices=2)
    body = _refusal(err)
    assert (body["code"], body["param"]) == ("sharding_unsupported", "sharding")
    assert "nu_dpftrl" in body["message"] and "correlated noise state" in body["message"]
    assert "not sharded" in body["message"]

    # an unknown value: refused at the schema, like every other enumerated field of the body
    # (privacy.noise.mechanism, privacy.clipping.sketch): 422 in the API's one error shape,
    # naming the field; never a 5xx
    for value in ("zero3", "FSDP", "", None, 2):
        with pytest.raises(openai.UnprocessableEntityError) as err:
            _create(client, f.id, sharding=value, devices=2)
        body = _refusal(err)
        assert (body["code"], body["param"], body["type"]) == (
            "invalid_value",
            "sharding",
            "invalid_request_error",
        ), value

    # more devices than any worker has: the devices refusal, as before
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, f.id, sharding="fsdp", devices=3)
    assert _refusal(err)["code"] == "devices_unavailable"

    assert not client.fine_tuning.jobs.list().data  # nothing was created

    # the same ν-DP-FTRL request, not sharded, is accepted: the refusal was the sharding's
    job = _create(client, f.id, NU_DPFTRL, sharding="none", devices=2)
    assert (job.model_extra["sharding"], job.model_extra["devices"]) == ("none", 2)


def test_the_job_object_shows_sharding_next_to_devices_and_the_plan_is_unchanged(service):
    client = service.client(service.key(f"echo-{uuid.uuid4().hex[:6]}"))
    f = client.files.create(file=("t.jsonl", learnable_lines(40)), purpose="fine-tune")

    plain = _create(client, f.id)  # a request that names neither
    assert (plain.model_extra["devices"], plain.model_extra["sharding"]) == (1, "none")
    ddp = _create(client, f.id, devices=2)
    assert (ddp.model_extra["devices"], ddp.model_extra["sharding"]) == (2, "none")
    fsdp = _create(client, f.id, devices=2, sharding="fsdp")
    assert (fsdp.model_extra["devices"], fsdp.model_extra["sharding"]) == (2, "fsdp")

    # retrieve and list show what create showed
    got = client.fine_tuning.jobs.retrieve(fsdp.id)
    assert (got.model_extra["devices"], got.model_extra["sharding"]) == (2, "fsdp")
    listed = {j.id: j.model_extra for j in client.fine_tuning.jobs.list(limit=10).data}
    assert {k: (v["devices"], v["sharding"]) for k, v in listed.items()} == {
        plain.id: (1, "none"),
        ddp.id: (2, "none"),
        fsdp.id: (2, "fsdp"),
    }
    # in the raw JSON, sharding sits next to devices
    raw = client.get(f"/fine_tuning/jobs/{fsdp.id}", cast_to=object)
    assert isinstance(raw, dict)
    keys = list(raw)
    assert keys.index("sharding") == keys.index("devices") + 1

    # the privacy plan does not depend on the sharding (the same Poisson sampling, the same σ)
    plan_keys = (
        "noise_multiplier",
        "sample_rate",
        "steps",
        "planned_epsilon",
        "target_delta",
        "dataset_size",
        "accountant",
        "mechanisms",
    )
    a, b, c = (j.model_extra["privacy"] for j in (plain, ddp, fsdp))
    for key in plan_keys:
        assert a[key] == b[key] == c[key], key
    # ... and the plan preview of the sharded request is the created job's
    preview = client.post(
        "/accountant/job_plan",
        cast_to=object,
        body={
            "model": "dprc-tiny-llama",
            "training_file": f.id,
            "hyperparameters": HP,
            "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
            "devices": 2,
            "sharding": "fsdp",
        },
    )
    assert isinstance(preview, dict)
    assert preview["noise_multiplier"] == c["noise_multiplier"]
    assert (preview["sample_rate"], preview["steps"]) == (c["sample_rate"], c["steps"])

    # the worker's side: the job as the worker reads it, and the runner's spec, carry it
    req = job_runs.job_request(service.store, fsdp.id)
    assert (req.devices, req.sharding) == (2, "fsdp")
    spec = build_spec(service.store, req)
    assert spec.sharding == "fsdp"
    assert build_spec(service.store, job_runs.job_request(service.store, ddp.id)).sharding == "none"


def test_idempotency_keys_fingerprint_requests_without_sharding_as_before(service):
    client = service.client(service.key(f"idem-{uuid.uuid4().hex[:6]}"))
    f = client.files.create(file=("t.jsonl", learnable_lines(32)), purpose="fine-tune")
    key = {"Idempotency-Key": f"sharding-{uuid.uuid4().hex}"}
    body = {
        "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
        "devices": 2,
    }

    def create(**extra):
        return client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            hyperparameters=HP,
            extra_body={**body, **extra},
            extra_headers=key,
        )

    first = create()
    assert first.model_extra["sharding"] == "none"
    assert create().id == first.id  # a replay: the same job
    assert create(sharding="none").id == first.id  # the default named: the same request
    with pytest.raises(openai.ConflictError) as err:
        create(sharding="fsdp")  # another request under the same key
    assert _refusal(err)["code"] == "idempotency_key_reused"
    assert len(client.fine_tuning.jobs.list().data) == 1


# request_hash of these bodies as the release before sharding computed them (git 03adb2a):
# a key stored then still matches a retry of the same request now
BEFORE_SHARDING = [
    (
        {
            "model": "dprc-tiny-llama",
            "training_file": "file-abc",
            "privacy": {"target_epsilon": 2.0},
        },
        "52f57deeeed1d450618bb0aa10997e64096d6d5ddb666b19d488386d5eb8a7eb",
    ),
    (
        {
            "model": "dprc-tiny-llama",
            "training_file": "file-abc",
            "hyperparameters": {"n_epochs": 2, "batch_size": 8},
            "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
            "devices": 2,
            "checkpoint_every": 4,
        },
        "74a7d77773c6ecd18f0dc1e08cdb6836864c7746c8d1c0c9470b51a8e28745dd",
    ),
]


@pytest.mark.parametrize(("body", "before"), BEFORE_SHARDING)
def test_the_fingerprint_of_a_request_without_sharding_is_unchanged(body, before):
    assert request_hash(JobCreate.model_validate(body)) == before
    assert request_hash(JobCreate.model_validate({**body, "sharding": "none"})) == before
    fsdp = {**body, "devices": 2, "sharding": "fsdp"}
    assert request_hash(JobCreate.model_validate(fsdp)) != before


# -- migration 0009 ---------------------------------------------------------------------------


def _fresh_database(backend: str, tmp_path) -> tuple[str | None, str | None]:
    """(database URL, PostgreSQL database name to drop); SQLite: a file under tmp_path."""
    if backend == "sqlite":
        return None, None
    name = f"dprc_sharding_{uuid.uuid4().hex[:12]}"
    with _pg_admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}", name


def _columns(engine: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("jobs")}


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_job_stored_before_0009_reads_sharding_none_and_0009_goes_down(backend, tmp_path):
    from service.store.tables import Job

    url, pg_name = _fresh_database(backend, tmp_path)
    engine = make_engine(Settings(data_dir=tmp_path, database_url=url))

    try:
        migrate(engine, "0008")
        assert "sharding" not in _columns(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tenants (name, created_at) VALUES ('old', 1)"))
            tenant = conn.execute(sa.text("SELECT id FROM tenants")).scalar_one()
            conn.execute(
                sa.text(
                    "INSERT INTO files (id, tenant_id, filename, purpose, bytes, created_at, "
                    "storage_path, n_examples, data_format, deleted) VALUES ('file-old', :t, "
                    "'t.jsonl', 'fine-tune', 1, 1, 'x', 100, 'text', false)"
                ),
                {"t": tenant},
            )
            privacy = json.dumps(
                {
                    "target_epsilon": 2.0,
                    "target_delta": 1e-4,
                    "clipping": {"method": "exact", "k": None},
                    "accountant": {"clipping": "exact"},
                }
            )
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (id, tenant_id, model, training_file_id, status, "
                    "created_at, hyperparameters, privacy, seed, noise_multiplier, sample_rate, "
                    "steps_total, accounting_clipping, accounting_k, steps_done, epsilon_spent, "
                    "result_files, cancel_requested, attempts, pause_requested, devices) VALUES "
                    "('ftjob-old', :t, 'dprc-tiny-llama', 'file-old', 'queued', 1, '{}', "
                    ":p, 1, 1.2, 0.1, 20, 'exact', NULL, 0, 0.0, '[]', false, 0, false, 2)"
                ),
                {"t": tenant, "p": privacy},
            )
        upgrade(engine)  # to head, as the service does at start-up
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT devices, sharding FROM jobs")).one()
        assert tuple(stored) == (2, "none")
        with Session(engine) as session:
            row = session.scalars(sa.select(Job)).one()
            shown = job_object(row, "org-1")
            assert (shown.devices, shown.sharding) == (2, "none")
        migrate(engine, "0008", down=True)
        assert "sharding" not in _columns(engine)
        with engine.connect() as conn:  # the job itself is kept
            assert conn.execute(sa.text("SELECT id FROM jobs")).scalar_one() == "ftjob-old"
        upgrade(engine)
        assert "sharding" in _columns(engine)
    finally:
        engine.dispose()
        if pg_name is not None:
            with _pg_admin_conn() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}"')


# -- end to end: a 2-device FSDP job --------------------------------------------------------


@pytest.mark.slow
def test_a_two_device_fsdp_job_runs_is_charged_its_plan_and_its_checkpoint_loads_whole(
    two_devices, tmp_path
):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    client = two_devices.client(two_devices.key("fsdp"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    job = _create(client, f.id, devices=2, sharding="fsdp", checkpoint_every=4)
    assert (job.model_extra["devices"], job.model_extra["sharding"]) == (2, "fsdp")
    job = wait_for(client, job.id, TERMINAL, timeout=600)
    assert job.status == "succeeded", job.error
    assert job.model_extra["sharding"] == "fsdp"
    # the ranks were handed the sharding with the rest of the spec (worker/ranks.py)
    handed = json.loads(
        (run_folder(two_devices.settings.data_dir, job.id) / "ranks" / "spec.json").read_text()
    )
    assert JobSpec.from_dict(handed).sharding == "fsdp"

    priv = job.model_extra["privacy"]
    assert priv["steps"] == 12  # ⌈2 · 48 / 8⌉
    assert job.model_extra["steps_done"] == 12
    # the ε charged is the plan's, and the accountant (called here on the plan) gives it
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        priv["steps"],
        priv["target_delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert abs(priv["planned_epsilon"] - want) <= 1e-9 * want
    assert abs(priv["epsilon_spent"] - priv["planned_epsilon"]) <= 1e-9 * want
    assert priv["epsilon_spent"] <= 8.0
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0
    assert abs(budget["spent"] - priv["epsilon_spent"]) <= 1e-6

    # the last checkpoint: downloadable, its ledger has each step once, its weights are the
    # whole model's (gathered from the shards), and it loads
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert sorted(c.step_number for c in ckpts) == [4, 8, 12]
    last = max(ckpts, key=lambda c: c.step_number)
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert not any(n.startswith("resume") for n in tar.getnames())
        tar.extractall(tmp_path / "ckpt", filter="data")
    ledger = PrivacyLedger.from_json((tmp_path / "ckpt" / "ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == 12
    assert abs(ledger.epsilon(priv["target_delta"]) - want) <= 1e-9 * want
    base = registry(two_devices.settings).get("dprc-tiny-llama")
    assert base is not None
    base_weights = load_file(base.path / "model.safetensors")
    weights = load_file(tmp_path / "ckpt" / "model" / "model.safetensors")
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        k: tuple(v.shape) for k, v in base_weights.items()
    }
    assert any(not weights[k].equal(base_weights[k]) for k in weights)  # it trained
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "ckpt" / "model", use_safetensors=True, trust_remote_code=False
    )
    base_model = AutoModelForCausalLM.from_pretrained(base.path, use_safetensors=True)
    assert model.num_parameters() == base_model.num_parameters() > 0
