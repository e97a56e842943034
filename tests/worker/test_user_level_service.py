"""User-level DP through the service (issue 31), on SQLite and PostgreSQL with the embedded
worker, driven by the official ``openai`` client over uvicorn: an upload reports its users, its
budget is per user (δ ≤ 1/U), a user-level job is planned over users (q = B/U, the library's σ
computed here), runs in the service's default secure mode and is charged per user; example-level
jobs on it, user-level jobs on data without users and mixed uploads are refused with reasons."""

from __future__ import annotations

import io
import json
import math
import tarfile
from collections.abc import Iterator

import openai
import pytest

from dprc_core.accounting import PrivacyLedger, epsilon, noise_multiplier
from dprc_core.training.plan import default_delta
from tests.api.conftest import Server
from tests.worker.conftest import serve_embedded, wait_for

# 24 users: one with 40 lines, five with 3, eighteen with 1 (73 lines)
OWNERS = (
    ["heavy"] * 40
    + [f"mid{i}" for i in range(5) for _ in range(3)]
    + [f"one{i}" for i in range(18)]
)
U, LINES = 24, len(OWNERS)
PATS = ["ab", "cd", "ef"]


def user_lines(field: str = "patient", owners: list[str] = OWNERS) -> bytes:
    rows = [
        {"text": PATS[i % 3] * (6 + i % 5) + f" {i}", field: owner}
        for i, owner in enumerate(owners)
    ]
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "users")


def test_a_user_level_job_is_planned_run_and_charged_per_user(service, tmp_path):
    client = service.client(service.key("users"))
    f = client.files.create(
        file=("notes.jsonl", user_lines()),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "6", "user_field": "patient"},
    )
    extra = f.model_extra
    assert (extra["user_field"], extra["n_users"], extra["max_lines_per_user"]) == (
        "patient",
        U,
        40,
    )
    assert extra["n_examples"] == LINES
    budget = extra["budget"]
    assert budget["unit"] == "user" and budget["delta"] == default_delta(U)
    assert budget["delta"] <= 1 / U

    # an example-level job on a data set whose lines name their users is refused
    with pytest.raises(openai.BadRequestError) as refused:
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            extra_body={"privacy": {"target_epsilon": 3.0}},
        )
    assert refused.value.body["code"] == "privacy_unit_mismatch"
    assert "per user" in refused.value.body["message"]

    hp = {"n_epochs": 2, "batch_size": 6, "learning_rate": 0.01, "max_seq_len": 32}
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters=hp,
        extra_body={
            "privacy": {"target_epsilon": 3.0, "clipping": {"method": "exact"}, "unit": "user"}
        },
    )
    p = job.model_extra["privacy"]
    assert p["unit"] == {
        "type": "user",
        "field": "patient",
        "max_examples_per_user": 8,  # min(8, the service's micro-batch of 8)
        "n_users": U,
        "max_lines_per_user": 40,
    }
    steps = math.ceil(2 * U / 6)
    assert (p["dataset_size"], p["sample_rate"], p["steps"]) == (U, 6 / U, steps)
    assert p["target_delta"] == default_delta(U)
    want = noise_multiplier(3.0, p["target_delta"], 6 / U, steps, "exact")
    assert p["noise_multiplier"] == pytest.approx(want, rel=1e-12)
    assert p["accountant"]["unit"] == "user" and "users" in p["accountant"]["sampling"]

    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.model_extra.get("error") or job
    spent = job.model_extra["privacy"]["epsilon_spent"]
    own = epsilon(p["noise_multiplier"], 6 / U, steps, p["target_delta"])
    assert spent == pytest.approx(own, rel=1e-6) and spent <= 3.0
    events = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=50).data]
    assert any("per user" in m for m in events), events
    # the checkpoint's ledger is the per-user event, and the user ids never reach it
    last = max(client.fine_tuning.jobs.checkpoints.list(job.id).data, key=lambda c: c.step_number)
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path / "ckpt", filter="data")
    ledger = PrivacyLedger.from_json((tmp_path / "ckpt" / "ledger.json").read_text())
    meta = json.loads((tmp_path / "ckpt" / "metadata.json").read_text())
    assert (meta["privacy_unit"], meta["units"]) == ("user", U)
    api_ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert api_ledger["unit"] == "user"
    assert sum(e.steps for e in ledger.events) == steps
    assert all(e.sample_rate == 6 / U for e in ledger.events)
    for path in (tmp_path / "ckpt").rglob("*"):
        if path.is_file() and path.suffix in {".json", ".txt", ".csv"}:
            assert "mid3" not in path.read_text(errors="ignore"), path
    # the budget: per user, charged with the job's ε
    after = client.files.retrieve(f.id).model_extra["budget"]
    assert after["unit"] == "user"
    assert after["spent"] == pytest.approx(
        epsilon(p["noise_multiplier"], 6 / U, steps, after["delta"]), rel=1e-3
    )


def test_units_that_do_not_fit_their_data_are_refused(service):
    client = service.client(service.key("units-refused"))
    plain = client.files.create(
        file=(
            "plain.jsonl",
            user_lines(owners=[f"x{i}" for i in range(20)]).replace(b'"patient"', b'"other"'),
        ),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "6", "user_field": "other"},
    )
    assert plain.model_extra["n_users"] == 20
    # lines naming a user and lines naming none, in one file: refused, naming the rule
    mixed = [json.dumps({"text": "ab" * 5, "user_id": "u1"}), json.dumps({"text": "cd" * 5})]
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(
            file=("mixed.jsonl", ("\n".join(mixed) + "\n").encode()),
            purpose="fine-tune",
            extra_body={"epsilon_budget": "6"},
        )
    assert "either every line names its user" in bad.value.body["message"]
    # a user field that is one of the example's own fields
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(
            file=("t.jsonl", user_lines()),
            purpose="fine-tune",
            extra_body={"epsilon_budget": "6", "user_field": "text"},
        )
    assert bad.value.body["param"] == "user_field"
    # a user-level job on data without users
    lines = ("\n".join(json.dumps({"text": f"line {i}"}) for i in range(30)) + "\n").encode()
    no_users = client.files.create(
        file=("n.jsonl", lines), purpose="fine-tune", extra_body={"epsilon_budget": "6"}
    )
    assert no_users.model_extra["n_users"] is None
    assert no_users.model_extra["budget"]["unit"] == "example"
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=no_users.id,
            extra_body={"privacy": {"target_epsilon": 3.0, "unit": {"type": "user"}}},
        )
    assert bad.value.body["code"] == "privacy_unit_mismatch"
    # the same lines without their users cannot join the per-user budget
    texts = [json.loads(line)["text"] for line in user_lines().decode().splitlines()[:10]]
    again = ("\n".join(json.dumps({"text": t}) for t in texts) + "\n").encode()
    with pytest.raises(openai.ConflictError) as conflict:
        client.files.create(file=("again.jsonl", again), purpose="fine-tune")
    assert conflict.value.body["code"] == "privacy_unit_conflict"
    assert "per user" in conflict.value.body["message"]
    # another field than the file's, and ν-DP-FTRL, for a user-level job
    base = {"target_epsilon": 3.0, "unit": {"type": "user", "field": "patient"}}
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama", training_file=plain.id, extra_body={"privacy": base}
        )
    assert bad.value.body["param"] == "privacy.unit.field"
    nu = {**base, "unit": {"type": "user"}, "noise": {"mechanism": "nu_dpftrl", "nu": 0.1}}
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=plain.id,
            extra_body={"privacy": {**nu, "clipping": {"method": "exact"}}},
        )
    assert bad.value.body["param"] == "privacy.noise.mechanism"
    big = {"target_epsilon": 3.0, "unit": {"type": "user", "max_examples_per_user": 9}}
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama", training_file=plain.id, extra_body={"privacy": big}
        )
    assert bad.value.body["param"] == "privacy.unit.max_examples_per_user"


def test_an_upload_in_parts_names_its_user_field(service):
    client = service.client(service.key("users-parts"))
    data = user_lines("author", [f"a{i % 7}" for i in range(30)])
    upload = client.uploads.create(
        bytes=len(data),
        filename="authors.jsonl",
        mime_type="text/jsonl",
        purpose="fine-tune",
        extra_body={"epsilon_budget": 5, "user_field": "author"},
    )
    assert upload.model_extra["user_field"] == "author"
    half = len(data) // 2
    first = client.uploads.parts.create(upload_id=upload.id, data=data[:half])
    second = client.uploads.parts.create(upload_id=upload.id, data=data[half:])
    done = client.uploads.complete(upload_id=upload.id, part_ids=[first.id, second.id])
    f = done.file.model_extra
    assert (f["user_field"], f["n_users"], f["max_lines_per_user"]) == ("author", 7, 5)
    assert f["budget"]["unit"] == "user" and f["budget"]["delta"] == default_delta(7)
    # a bad field name is refused at creation, before any part
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.create(
            bytes=10,
            filename="x.jsonl",
            mime_type="text/jsonl",
            purpose="fine-tune",
            extra_body={"user_field": "messages"},
        )
    assert bad.value.body["param"] == "user_field"
