"""Per-example sketches through the service (``privacy.clipping.sketch``): the plan, the job
object, the budget, the accountant endpoints and the store's migration, on PostgreSQL and
SQLite, with the official ``openai`` client over uvicorn. Every expected value is computed here
with the library's accountant, independently of the service."""

from __future__ import annotations

import uuid

import openai
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyEvent, epsilon, epsilon_for_events, noise_multiplier
from service.base.settings import Settings
from service.store.db import MIGRATIONS, make_engine, upgrade
from tests.api.conftest import _pg_admin_conn, jsonl, text_lines

N = 200
HP = {"n_epochs": 2, "batch_size": 16}
STEPS = -(-2 * N // 16)  # ⌈n_epochs·N/B⌉ = 25


def _create(client, file_id: str, clipping: dict, target: float = 2.0):
    return client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=file_id,
        hyperparameters=HP,
        extra_body={"privacy": {"target_epsilon": target, "clipping": clipping}},
    )


def test_a_per_example_job_is_planned_charged_and_shown_with_its_sketch(server):
    client = server.client(server.key("sketch-plan"))
    budgeted = client.files.create(
        file=("t.jsonl", text_lines(N)), purpose="fine-tune", extra_body={"epsilon_budget": "5"}
    )
    # other data (the same lines would join the budgeted upload's budget group)
    other_lines = jsonl([{"text": f"another example {i}"} for i in range(N)])
    other = client.files.create(file=("u.jsonl", other_lines), purpose="fine-tune")

    per = _create(client, budgeted.id, {"method": "hutch", "k": 32, "sketch": "per_example"})
    shared = _create(client, other.id, {"method": "hutch", "k": 32, "sketch": "shared"})
    default = _create(client, other.id, {"method": "hutch", "k": 32})
    p, s = per.model_extra["privacy"], shared.model_extra["privacy"]
    assert p["clipping"] == {
        "norm_method": "hutch",
        "method": "hutch",  # the deprecated name, echoed for one release
        "k": 32,
        "sketch": "per_example",
    }
    assert s["clipping"]["sketch"] == "shared"
    # no sketch asked for: per-example, the default for randomized methods, planned as such
    d = default.model_extra["privacy"]
    assert d["clipping"]["sketch"] == d["accountant"]["sketch"] == "per_example"
    assert d["noise_multiplier"] == p["noise_multiplier"]
    assert p["accountant"]["sketch"] == "per_example" and s["accountant"]["sketch"] == "shared"
    assert "hidden-scale" in p["accountant"]["sketch_model"]
    # the hidden-scale law the job is planned, charged and run on (shared: none)
    assert p["accountant"]["scale_width"] == 0.01 and "scale_width" not in s["accountant"]
    assert (p["steps"], p["sample_rate"]) == (s["steps"], s["sample_rate"]) == (STEPS, 16 / N)
    assert p["target_delta"] == s["target_delta"]
    # the same ε needs less noise with per-example sketches
    assert p["noise_multiplier"] < s["noise_multiplier"]
    q, delta = p["sample_rate"], p["target_delta"]
    want = noise_multiplier(2.0, delta, q, STEPS, "hutch", 32, sketch="per_example")
    assert p["noise_multiplier"] == pytest.approx(want, rel=1e-12)
    assert s["noise_multiplier"] == pytest.approx(
        noise_multiplier(2.0, delta, q, STEPS, "hutch", 32), rel=1e-12
    )
    per_eps = epsilon(p["noise_multiplier"], q, STEPS, delta, "hutch", 32, sketch="per_example")
    assert p["planned_epsilon"] == pytest.approx(per_eps, rel=1e-9) and per_eps <= 2.0
    # read back from the store: the same object
    again = client.fine_tuning.jobs.retrieve(per.id).model_extra["privacy"]
    assert again["clipping"]["sketch"] == again["accountant"]["sketch"] == "per_example"

    # the budget charges the per-example event: the file's committed ε is its ε (one job),
    # at creation (the plan's event) and recomposed from the stored job (its row's columns)
    created = client.files.retrieve(budgeted.id).model_extra["budget"]
    with server.http(server.key("sketch-plan")) as http:
        r = http.post(
            f"/v1/files/{budgeted.id}/budget", json={"epsilon_budget": 5.0, "reason": "r"}
        )
    assert r.status_code == 200, r.text
    budget = r.json()["budget"]
    assert budget["committed"] == pytest.approx(created["committed"], rel=1e-9)
    event = PrivacyEvent(p["noise_multiplier"], q, STEPS, "hutch", 32, sketch="per_example")
    assert budget["committed"] == pytest.approx(
        epsilon_for_events([event], budget["delta"]), rel=1e-3
    )
    as_shared = epsilon_for_events(
        [PrivacyEvent(p["noise_multiplier"], q, STEPS, "hutch", 32)], budget["delta"]
    )
    assert as_shared > budget["committed"] * 1.01  # the shared model would have charged more

    # the job's ledger names the sketch of its planned event
    ledger = client.get(f"/fine_tuning/jobs/{per.id}/ledger", cast_to=object)
    assert ledger["planned"]["sketch"] == "per_example"
    assert ledger["planned"]["scale_width"] == 0.01
    assert (
        "sketch"
        not in client.get(f"/fine_tuning/jobs/{shared.id}/ledger", cast_to=object)["planned"]
    )  # shared events are written as before
    events = client.fine_tuning.jobs.list_events(per.id, limit=10).data
    plan_event = next(e for e in events if e.message.startswith("Privacy plan"))
    assert plan_event.data["sketch"] == "per_example"

    # the preview plans the same, and says what it charges
    with server.http(server.key("sketch-plan")) as http:
        preview = http.post(
            "/v1/accountant/job_plan",
            json={
                "model": "dprc-tiny-llama",
                "training_file": other.id,
                "hyperparameters": HP,
                "privacy": {
                    "target_epsilon": 2.0,
                    "clipping": {"method": "hutch", "k": 32, "sketch": "per_example"},
                },
            },
        )
    assert preview.status_code == 200, preview.text
    body = preview.json()
    assert body["sketch"] == body["accounting_sketch"] == "per_example"
    assert body["noise_multiplier"] == p["noise_multiplier"]


def test_auto_takes_per_example_and_is_charged_as_hutch(server):
    client = server.client(server.key("sketch-auto"))
    f = client.files.create(file=("t.jsonl", text_lines(N)), purpose="fine-tune")
    job = _create(client, f.id, {"method": "auto", "k": 16, "sketch": "per_example"})
    p = job.model_extra["privacy"]
    acc = p["accountant"]
    assert (acc["clipping"], acc["k"], acc["sketch"]) == ("hutch", 16, "per_example")
    want = noise_multiplier(
        2.0, p["target_delta"], p["sample_rate"], STEPS, "hutch", 16, sketch="per_example"
    )
    assert p["noise_multiplier"] == pytest.approx(want, rel=1e-12)


def test_per_example_with_exact_norms_and_bad_values_are_refused(server):
    client = server.client(server.key("sketch-refused"))
    f = client.files.create(file=("t.jsonl", text_lines(N)), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as refused:
        _create(client, f.id, {"method": "exact", "sketch": "per_example"})
    assert refused.value.status_code == 400
    err = refused.value.body
    assert err["param"] == "privacy.clipping.sketch" and err["code"] == "invalid_value"
    assert "randomized" in err["message"] and "exact" in err["message"]
    # ν-DP-FTRL takes exact clipping only: no per-example sketch either
    with pytest.raises(openai.BadRequestError) as ftrl:
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            hyperparameters=HP,
            extra_body={
                "privacy": {
                    "target_epsilon": 2.0,
                    "clipping": {"method": "exact", "sketch": "per_example"},
                    "noise": {"mechanism": "nu_dpftrl", "nu": 0.1},
                }
            },
        )
    assert ftrl.value.body["param"] == "privacy.clipping.sketch"
    # an unknown sketch: 422 naming the field, as for every enum of the request
    for bad in ("per-example", "none", 1):
        with pytest.raises(openai.UnprocessableEntityError) as invalid:
            _create(client, f.id, {"method": "hutch", "sketch": bad})
        assert invalid.value.body["param"] == "privacy.clipping.sketch"
    assert client.fine_tuning.jobs.list().data == []  # nothing was created
    # exact with no sketch asked for is not refused: nothing is drawn, the job says shared
    plain = _create(client, f.id, {"method": "exact"}).model_extra["privacy"]
    assert plain["clipping"]["sketch"] == plain["accountant"]["sketch"] == "shared"


def test_accountant_endpoints_take_the_sketch(server):
    sigma, q, steps, delta = 1.0, 0.02, 500, 1e-5
    with server.http(server.key("sketch-acc")) as http:

        def post(path: str, **body) -> dict:
            r = http.post(f"/v1/accountant/{path}", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        job = {"sample_rate": q, "steps": steps, "clipping": "hutch", "k": 32}
        per = post("epsilon", noise_multiplier=sigma, delta=delta, sketch="per_example", **job)
        shared = post("epsilon", noise_multiplier=sigma, delta=delta, **job)
        assert per["sketch"] == "per_example" and shared["sketch"] == "shared"
        assert "hidden-scale" in per["sketch_model"]
        want = epsilon(sigma, q, steps, delta, "hutch", 32, sketch="per_example")
        assert per["epsilon"] == pytest.approx(want, rel=1e-12)
        assert per["epsilon"] < shared["epsilon"]
        assert shared["epsilon"] == pytest.approx(epsilon(sigma, q, steps, delta, "hutch", 32))

        cal = post(
            "noise_multiplier", target_epsilon=2.0, target_delta=delta, sketch="per_example", **job
        )
        want_sigma = noise_multiplier(2.0, delta, q, steps, "hutch", 32, sketch="per_example")
        assert cal["noise_multiplier"] == pytest.approx(want_sigma, rel=1e-12)
        assert cal["sketch"] == "per_example" and cal["epsilon"] <= 2.0
        cal_shared = post("noise_multiplier", target_epsilon=2.0, target_delta=delta, **job)
        assert cal["noise_multiplier"] < cal_shared["noise_multiplier"]

        # per_example with exact norms, or with ν-DP-FTRL: 400 naming the sketch
        for body in (
            {"sample_rate": q, "steps": steps, "clipping": "exact"},
            {
                "mechanism": "nu_dpftrl",
                "steps": 8,
                "nu": 0.1,
                "participations": 2,
                "min_separation": 4,
            },
        ):
            r = http.post(
                "/v1/accountant/epsilon",
                json={"noise_multiplier": 1.0, "delta": delta, "sketch": "per_example", **body},
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "sketch"
        r = http.post(
            "/v1/accountant/noise_multiplier",
            json={"target_epsilon": 2.0, "target_delta": delta, "sketch": "hidden", **job},
        )
        assert r.status_code == 422 and r.json()["error"]["param"] == "sketch"


# -- the store: jobs made before the sketch column ----------------------------------------


def _fresh_database(backend: str, tmp_path) -> tuple[str | None, str | None]:
    """(database URL, PostgreSQL database name to drop); SQLite: a file under tmp_path."""
    if backend == "sqlite":
        return None, None
    name = f"dprc_sketch_{uuid.uuid4().hex[:12]}"
    with _pg_admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    from tests.api.conftest import PG_ADMIN

    return f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}", name


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_job_stored_before_0004_reads_shared_after_the_upgrade(backend, tmp_path):
    from api.jobs.views import job_object
    from service.budget import budget
    from service.store.tables import Job

    url, pg_name = _fresh_database(backend, tmp_path)
    engine = make_engine(Settings(data_dir=tmp_path, database_url=url))
    try:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003")
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tenants (name, created_at) VALUES ('old', 1)"))
            tenant = conn.execute(sa.text("SELECT id FROM tenants")).scalar_one()
            conn.execute(
                sa.text(
                    "INSERT INTO files (id, tenant_id, filename, purpose, bytes, created_at, "
                    "storage_path, n_examples, data_format, epsilon_spent, epsilon_committed, "
                    "deleted) VALUES ('file-old', :t, 't.jsonl', 'fine-tune', 1, 1, 'x', 100, "
                    "'text', 0, 0, false)"
                ),
                {"t": tenant},
            )
            privacy = (
                '{"target_epsilon": 2.0, "target_delta": 0.0001, "clipping": {"method": '
                '"hutch", "k": 32}, "accountant": {"clipping": "hutch", "k": 32}}'
            )
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (id, tenant_id, model, training_file_id, status, "
                    "created_at, hyperparameters, privacy, seed, noise_multiplier, sample_rate, "
                    "steps_total, accounting_clipping, accounting_k, steps_done, epsilon_spent, "
                    "result_files, cancel_requested, attempts, pause_requested, devices) VALUES "
                    "('ftjob-old', :t, 'dprc-tiny-llama', 'file-old', 'succeeded', 1, '{}', "
                    ":p, 1, 1.2, 0.1, 20, 'hutch', 32, 20, 1.0, '[]', false, 1, false, 1)"
                ),
                {"t": tenant, "p": privacy},
            )
        upgrade(engine)  # to head, as the service does at start-up
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT accounting_sketch FROM jobs")).scalar_one()
        assert stored == "shared"
        with Session(engine) as session:
            row = session.scalars(sa.select(Job)).one()
            assert budget.spent_event(row) == PrivacyEvent(1.2, 0.1, 20, "hutch", 32)
            privacy_out = job_object(row, "org-1").privacy
        assert privacy_out["clipping"]["sketch"] == "shared"
        assert privacy_out["accountant"]["sketch"] == "shared"
    finally:
        engine.dispose()
        if pg_name is not None:
            with _pg_admin_conn() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}"')
