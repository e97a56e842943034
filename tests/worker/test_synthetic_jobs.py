"""Issue 44 through the service: a synthetic-data job from a training file, driven by the
official ``openai`` client over uvicorn (its generic ``post``/``get``, as for any endpoint it
has no method for), on SQLite and PostgreSQL with the embedded worker.

The job fine-tunes a tiny Llama on classification lines (its own DP fine-tuning job, charged
to the file's budget), releases the label histogram under DP and generates the records. Checked
against Google dp_accounting (composed independently: the subsampled Gaussian's PLD
self-composed, then the histogram's Gaussian): the data set's ε on the job, in its file's
provenance and in the group's committed ε. A trainer reads the job but not the owner's report
(403); a data owner reads it; training on the synthetic file charges no one; an upload cannot
carry provenance; another tenant's job is a 404; a histogram that does not fit the budget is
refused and leaves no job behind."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl

from tests.api.conftest import Server
from tests.worker.conftest import serve_embedded, wait_for

HP = {"n_epochs": 2, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32}
PRIVACY = {"target_epsilon": 4.0, "clipping": {"method": "exact"}}


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = rng.choice(["calm", "angry"])
        word = rng.choice(["fine", "ok", "nice"] if label == "calm" else ["bad", "awful", "mad"])
        out.append({"text": f"it is {word} {i} ({seed})", "label": label})
    return out


def _chat(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"say {i}"},
            {"role": "assistant", "content": f"{i} said"},
        ]
    }


def _jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "synthetic")


def _wait(client: openai.OpenAI, job_id: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/synthetic_data/jobs/{job_id}", cast_to=object)
        if job["status"] in {"succeeded", "failed", "cancelled"}:
            return job
        assert time.monotonic() < deadline, f"synthetic job {job_id} still {job['status']}"
        time.sleep(0.3)


def _reference_epsilon(events: list[dict], delta: float) -> float:
    """dp_accounting's pessimistic PLD of the events composed (subsampled Gaussian steps)."""
    pld = None
    for e in events:
        assert e["clipping"] == "exact"
        one = dpl.from_gaussian_mechanism(
            e["noise_multiplier"],
            sampling_prob=e["sample_rate"],
            value_discretization_interval=1e-4,
            pessimistic_estimate=True,
        ).self_compose(e["steps"])
        pld = one if pld is None else pld.compose(one)
    assert pld is not None
    return pld.get_epsilon_for_delta(delta)


def test_a_synthetic_job_from_a_training_file(served):
    tenant = f"synth {served.settings.data_dir.name}"
    owner = served.client(served.key(tenant, "data_owner"))
    trainer = served.client(served.key(tenant, "trainer"))
    train = owner.files.create(
        file=("reviews.jsonl", _jsonl(_rows(64, 0))),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 12},
    )
    holdout = owner.files.create(
        file=("held.jsonl", _jsonl(_rows(16, 1))),
        purpose="fine-tune",
        extra_body={"unbudgeted": "true"},
    )
    body = {
        "n": 10,
        "training_file": train.id,
        "fine_tuning": {"model": "dprc-tiny-llama", "hyperparameters": HP, "privacy": PRIVACY},
        "label_epsilon": 0.5,
        "sampling": {"max_tokens": 12},
        "seed": 7,
        "holdout_file": holdout.id,
    }
    created = trainer.post("/synthetic_data/jobs", body=body, cast_to=object)
    assert created["object"] == "synthetic_data.job" and created["format"] == "classification"
    assert created["labels"]["type"] == "dp" and created["labels"]["epsilon"] == 0.5
    assert created["privacy"]["epsilon"] > 0  # planned: the fine-tuning's plan and the histogram

    job = _wait(trainer, created["id"])
    assert job["status"] == "succeeded", job
    ft = wait_for(trainer, job["fine_tuning_job"], {"succeeded"})
    assert job["model"] == ft.fine_tuned_model
    events = job["privacy"]["events"]
    assert len(events) == 2 and events[1]["sample_rate"] == 1.0 and events[1]["steps"] == 1
    assert sorted(job["privacy"]["label_histogram"]["classes"]) == ["angry", "calm"]
    delta = job["privacy"]["delta"]
    ref = _reference_epsilon(events, delta)
    eps = job["privacy"]["epsilon"]
    assert ref * 0.995 <= eps <= ref * 1.01

    # the group's committed ε composes the fine-tuning and the histogram: the same number
    budget = owner.files.retrieve(train.id).model_extra["budget"]
    assert budget["committed"] == pytest.approx(eps, rel=1e-9)
    assert budget["spent"] == pytest.approx(eps, rel=1e-9)

    # the records: a data set of their own, with the provenance and the same (ε, δ)
    result = trainer.files.retrieve(job["result_file"])
    extra = result.model_extra
    assert extra["format"] == "classification" and extra["n_examples"] == 10
    prov = extra["synthetic"]
    assert prov["epsilon"] == eps and prov["delta"] == delta
    assert prov["source_budget_group"] == budget_group(owner, train.id)
    assert prov["fine_tuning_job"] == ft.id and prov["privacy_unit"] == "example"
    assert extra["budget"] is None
    lines = trainer.files.content(result.id).text.splitlines()
    assert len(lines) == 10 and {json.loads(x)["label"] for x in lines} <= {"calm", "angry"}
    log = trainer.get(f"/synthetic_data/jobs/{job['id']}/events", cast_to=object)["data"]
    assert any("label histogram" in e["message"] for e in log)

    # the owner's report: not for a trainer
    with pytest.raises(openai.PermissionDeniedError):
        trainer.get(f"/synthetic_data/jobs/{job['id']}/report", cast_to=object)
    report = owner.get(f"/synthetic_data/jobs/{job['id']}/report", cast_to=object)
    assert report["private"] is True and "not differentially private" in report["note"]
    assert report["leakage"]["exact_copies"] >= 0 and report["counts"]["synthetic"] == 10

    # the data owner says who downloads the records (admin always)
    assert job["download_roles"] == ["data_owner", "trainer"]
    with pytest.raises(openai.PermissionDeniedError):  # a trainer does not decide
        trainer.post(
            f"/synthetic_data/jobs/{job['id']}/sharing", body={"download_roles": []}, cast_to=object
        )
    shared = owner.post(
        f"/synthetic_data/jobs/{job['id']}/sharing",
        body={"download_roles": ["viewer"]},
        cast_to=object,
    )
    assert shared["download_roles"] == ["viewer"]
    with pytest.raises(openai.PermissionDeniedError):
        trainer.files.content(result.id)
    viewer = served.client(served.key(tenant, "viewer"))
    assert viewer.files.content(result.id).text.splitlines() == lines
    owner.post(
        f"/synthetic_data/jobs/{job['id']}/sharing",
        body={"download_roles": ["data_owner", "trainer"]},
        cast_to=object,
    )

    # training on the synthetic records (a classifier: train on synthetic) charges no one
    before = owner.files.retrieve(train.id).model_extra["budget"]
    again = trainer.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=result.id,
        hyperparameters={"n_epochs": 1, "batch_size": 4, "max_seq_len": 16},
        extra_body={"privacy": PRIVACY},
    )
    assert wait_for(trainer, again.id, {"succeeded", "failed"}).status == "succeeded"
    assert owner.files.retrieve(train.id).model_extra["budget"] == before
    assert trainer.files.retrieve(result.id).model_extra["budget"] is None

    # another tenant sees nothing
    other = served.client(served.key(f"other {served.settings.data_dir.name}"))
    with pytest.raises(openai.NotFoundError):
        other.get(f"/synthetic_data/jobs/{job['id']}", cast_to=object)


def budget_group(client: openai.OpenAI, file_id: str) -> str:
    return client.files.retrieve(file_id).model_extra["budget_group"]


def test_an_upload_cannot_claim_to_be_synthetic_and_a_histogram_must_fit(served):
    tenant = f"claims {served.settings.data_dir.name}"
    admin = served.client(served.key(tenant))
    with pytest.raises(openai.BadRequestError) as refused:
        admin.files.create(
            file=("x.jsonl", _jsonl(_rows(8, 2))),
            purpose="fine-tune",
            extra_body={"epsilon_budget": 5, "synthetic": json.dumps({"epsilon": 0})},
        )
    assert refused.value.body["code"] == "unknown_field"
    f = admin.files.create(
        file=("y.jsonl", _jsonl(_rows(40, 3))),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 5},
    )
    assert f.model_extra["synthetic"] is None
    body = {
        "n": 4,
        "training_file": f.id,
        "fine_tuning": {"model": "dprc-tiny-llama", "hyperparameters": HP, "privacy": PRIVACY},
        "label_epsilon": 3.0,  # 4 for the fine-tuning and 3 for the labels: over 5
    }
    with pytest.raises(openai.ConflictError) as refused:
        admin.post("/synthetic_data/jobs", body=body, cast_to=object)
    assert refused.value.body["code"] == "budget_exceeded"
    jobs = admin.fine_tuning.jobs.list().data
    assert [j.status for j in jobs] == ["cancelled"]  # the fine-tuning it came with: gone
    assert admin.get("/synthetic_data/jobs", cast_to=object)["data"] == []
    budget = admin.files.retrieve(f.id).model_extra["budget"]
    assert budget["committed"] == 0 and budget["spent"] == 0
    with pytest.raises(openai.BadRequestError) as refused:  # a label is one of the classes
        admin.post(
            "/synthetic_data/jobs",
            body={**body, "labels": {"calm": 1, "my secret line": 1}},
            cast_to=object,
        )
    assert refused.value.body["param"] == "labels"
    assert [j.status for j in admin.fine_tuning.jobs.list().data] == ["cancelled", "cancelled"]
    chat = admin.files.create(
        file=("c.jsonl", _jsonl([_chat(i) for i in range(12)])),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 5},
    )
    trainer = served.client(served.key(tenant, "trainer"))
    with pytest.raises(openai.PermissionDeniedError):  # prompts land in a budget-free data set
        trainer.post(
            "/synthetic_data/jobs",
            body={
                **body,
                "training_file": chat.id,
                "label_epsilon": None,
                "prompts": [[{"role": "user", "content": "a line copied from the data"}]],
            },
            cast_to=object,
        )
    assert len(admin.fine_tuning.jobs.list().data) == 2  # none created for it
    prompts = [[{"role": "user", "content": "say 3"}], [{"role": "user", "content": "say 4"}]]
    made = admin.post(  # an admin owns budgets: its prompts are public text it vouches for
        "/synthetic_data/jobs",
        body={
            "n": 3,
            "training_file": chat.id,
            "fine_tuning": {"model": "dprc-tiny-llama", "hyperparameters": HP, "privacy": PRIVACY},
            "prompts": prompts,
            "sampling": {"max_tokens": 6},
        },
        cast_to=object,
    )
    assert made["format"] == "chat" and made["labels"] == {"type": "none"}
    done = _wait(admin, made["id"])
    assert done["status"] == "succeeded" and len(done["privacy"]["events"]) == 1
    records = [json.loads(x) for x in admin.files.content(done["result_file"]).text.splitlines()]
    assert len(records) == 3 and all(r["messages"][:-1] in prompts for r in records)
    assert all(r["messages"][-1]["role"] == "assistant" for r in records)
    with pytest.raises(openai.UnprocessableEntityError):  # a body field the API does not know
        admin.post("/synthetic_data/jobs", body={**body, "synthetic": True}, cast_to=object)
    with pytest.raises(openai.BadRequestError) as refused:  # chat needs public prompts
        admin.post(
            "/synthetic_data/jobs",
            body={"n": 2, "model": "dprc-tiny-llama", "labels": "uniform"},
            cast_to=object,
        )
    assert refused.value.body["param"] == "model"


def test_concurrent_creates_from_a_generator_never_overdraw_the_budget(served):
    tenant = f"burst {served.settings.data_dir.name}"
    owner = served.client(served.key(tenant, "data_owner"))
    trainer_key = served.key(tenant, "trainer")
    trainer = served.client(trainer_key)
    f = owner.files.create(
        file=("b.jsonl", _jsonl(_rows(48, 5))),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 6},
    )
    body = {
        "n": 4,
        "training_file": f.id,
        "fine_tuning": {"model": "dprc-tiny-llama", "hyperparameters": HP, "privacy": PRIVACY},
        "label_epsilon": 0.3,
        "sampling": {"max_tokens": 6},
    }
    first = _wait(trainer, trainer.post("/synthetic_data/jobs", body=body, cast_to=object)["id"])
    assert first["status"] == "succeeded"
    burst = {"n": 2, "model": first["model"], "label_epsilon": 1.0, "sampling": {"max_tokens": 4}}

    def create(_: int) -> int:
        with served.http(trainer_key) as http:
            return http.post("/v1/synthetic_data/jobs", json=burst).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(create, range(8)))
    assert set(codes) <= {200, 409} and 200 in codes and 409 in codes, codes
    accepted = [
        _wait(trainer, j["id"])
        for j in trainer.get("/synthetic_data/jobs", cast_to=object)["data"]
        if j["id"] != first["id"]
    ]
    assert len(accepted) == codes.count(200)
    events = list(first["privacy"]["events"])
    for job in accepted:
        assert job["status"] == "succeeded"
        events.append(job["privacy"]["events"][1])
    budget = owner.files.retrieve(f.id).model_extra["budget"]
    assert budget["committed"] <= 6 + 1e-9
    ref = _reference_epsilon(events, budget["delta"])
    assert ref * 0.995 <= budget["committed"] <= ref * 1.01
