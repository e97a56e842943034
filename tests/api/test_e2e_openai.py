"""End to end with the official ``openai`` client over uvicorn, on PostgreSQL and SQLite."""

from __future__ import annotations

import io
import json
import tarfile

import openai
import pytest

from dprc_core.accounting import epsilon, epsilon_for_events
from dprc_core.training.plan import default_delta
from service.jobs import job_runs
from tests.api.conftest import labelled_lines, text_lines


def _check_sigma(privacy: dict) -> None:
    """σ is calibrated: ε(σ) ≤ target and ε(σ/(1+rel_tol)) > target (the library's contract),
    recomputed here with the accountant."""
    q, steps, delta = privacy["sample_rate"], privacy["steps"], privacy["target_delta"]
    acc = privacy["accountant"]
    clip, k, sketch = acc["clipping"], acc["k"], acc["sketch"]
    sigma, target = privacy["noise_multiplier"], privacy["target_epsilon"]
    assert epsilon(sigma, q, steps, delta, clip, k, sketch=sketch) <= target
    assert epsilon(sigma / 1.005, q, steps, delta, clip, k, sketch=sketch) > target


def test_happy_path(server, tmp_path):
    client = server.client(server.key("happy"))
    n = 200
    uploaded = client.files.create(
        file=("reviews.jsonl", labelled_lines(n)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "6", "delta": "0.001"},
    )
    assert uploaded.model_extra["n_examples"] == n
    assert uploaded.model_extra["budget"]["epsilon"] == 6.0
    assert uploaded.model_extra["budget"]["delta"] == 0.001
    assert uploaded.model_extra["budget"]["remaining"] == 6.0
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert uploaded.id in [f.id for f in client.files.list()]
    assert client.files.content(uploaded.id).content == labelled_lines(n)

    models = {m.id: m for m in client.models.list()}
    assert models["minilm-l6-v2"].model_extra["task"] == "classification"
    assert models["dprc-tiny-llama"].model_extra["task"] == "causal_lm"

    job = client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=uploaded.id,
        hyperparameters={"n_epochs": 2, "batch_size": 16},
        suffix="reviews",
        seed=7,
        metadata={"team": "a"},
        extra_body={
            "privacy": {
                "target_epsilon": 2.0,
                "target_delta": 1e-3,
                "clipping": {"method": "hutch", "k": 32},
                "report_train_loss": False,
            }
        },
    )
    assert job.status == "queued"
    assert job.seed == 7 and job.metadata == {"team": "a"}
    assert job.user_provided_suffix == "reviews"
    privacy = job.model_extra["privacy"]
    assert privacy["sample_rate"] == 16 / n
    assert privacy["steps"] == -(-2 * n // 16)  # ⌈n_epochs·N/B⌉ = 25
    assert privacy["report_train_loss"] is False
    assert privacy["planned_epsilon"] <= 2.0
    assert job.model_extra["steps_total"] == privacy["steps"]
    assert job.model_extra["steps_done"] == 0
    _check_sigma(privacy)

    # the file's budget now holds the reservation
    budget = client.files.retrieve(uploaded.id).model_extra["budget"]
    assert budget["spent"] == 0.0
    assert budget["committed"] == pytest.approx(
        epsilon(
            privacy["noise_multiplier"],
            privacy["sample_rate"],
            privacy["steps"],
            1e-3,
            "hutch",
            32,
            sketch="per_example",  # the default for hutch
        )
    )
    assert budget["remaining"] == pytest.approx(6.0 - budget["committed"])

    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
    page = client.fine_tuning.jobs.list(limit=5)
    assert job.id in [j.id for j in page.data]
    events = client.fine_tuning.jobs.list_events(job.id)
    assert any("Privacy plan" in e.message for e in events.data)
    assert client.fine_tuning.jobs.checkpoints.list(job.id).data == []

    ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert ledger["ledger"]["format"] == "dprc-privacy-ledger"
    assert ledger["ledger"]["events"] == []
    assert ledger["planned"]["steps"] == privacy["steps"]

    # a checkpoint written by the worker-side service function: listed, archive downloadable
    archive = tmp_path / "ckpt.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("ledger.json")
        payload = json.dumps({"events": []}).encode()
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    data = archive.read_bytes()
    job_runs.record_checkpoint(
        server.store, job.id, 5, 0.5, archive, {"train_loss": 1.0, "clipped_fraction": 0.2}
    )
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in ckpts] == [5]
    assert "train_loss" not in ckpts[0].metrics  # report_train_loss: false
    assert client.files.content(ckpts[0].model_extra["file_id"]).content == data

    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    budget = client.files.retrieve(uploaded.id).model_extra["budget"]
    assert budget["committed"] == 0.0 and budget["remaining"] == 6.0
    # the file is no longer used by an active job: it can be deleted
    assert client.files.delete(uploaded.id).deleted is True
    # its content is gone; its privacy record is not (docs/governance.md)
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)
    gone = client.files.retrieve(uploaded.id).model_extra
    assert gone["deleted"] is True and gone["budget"]["epsilon"] == 6.0
    assert uploaded.id not in [f.id for f in client.files.list()]


def test_pagination_and_default_delta(server):
    client = server.client(server.key("pages"))
    f = client.files.create(file=("t.jsonl", labelled_lines(100)), purpose="fine-tune")
    ids, seeds = [], []
    for _ in range(3):
        job = client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=f.id,
            hyperparameters={"n_epochs": 1, "batch_size": 10},
            extra_body={"privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}}},
        )
        ids.append(job.id)
        seeds.append(job.seed)
        delta = job.model_extra["privacy"]["target_delta"]
        # the library's default (the runner's): 1/N^1.1 rounded down to 2 significant digits
        assert delta == default_delta(100) and 0.9 * 100**-1.1 <= delta <= 100**-1.1
    # no seed given: 63 secret bits each (all three below 2^31 has probability 2^-96)
    assert len(set(seeds)) == 3 and all(0 <= s < 2**63 for s in seeds)
    assert max(seeds) >= 2**31
    first = client.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in first.data] == ids[::-1][:2] and first.has_more
    rest = client.fine_tuning.jobs.list(limit=2, after=first.data[-1].id)
    assert [j.id for j in rest.data] == [ids[0]] and not rest.has_more
    assert [j.id for j in client.fine_tuning.jobs.list(limit=1)] == ids[::-1]
    events = client.fine_tuning.jobs.list_events(ids[0], limit=100).data
    assert len(events) >= 3
    first_events = client.fine_tuning.jobs.list_events(ids[0], limit=1)
    assert first_events.has_more and first_events.data[0].id == events[0].id
    paged = [e.id for e in client.fine_tuning.jobs.list_events(ids[0], limit=1)]
    assert paged == [e.id for e in events]
    files_page = client.files.list(limit=1)
    assert [x.id for x in files_page.data] == [f.id] and not files_page.has_more
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.list_events(ids[0], after=ids[1])  # not an event of this job


def test_causal_lm_job_builds_tiny_model(server):
    client = server.client(server.key("causal"))
    f = client.files.create(file=("t.jsonl", text_lines(50)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 5, "lora": {"r": 4}},
        extra_body={"privacy": {"target_epsilon": 3.0}},
    )
    privacy = job.model_extra["privacy"]
    # the defaults: auto, k = 32, per-example sketches (auto is randomized)
    assert privacy["clipping"] == {
        "norm_method": "auto",
        "method": "auto",  # the deprecated name, echoed for one release
        "k": 32,
        "sketch": "per_example",
    }
    assert privacy["accountant"]["clipping"] == "hutch"  # auto is planned as hutch
    assert privacy["accountant"]["sketch"] == "per_example"
    _check_sigma(privacy)
    model = client.models.retrieve("dprc-tiny-llama")
    assert model.model_extra["ready"] is True
    # a causal LM cannot train on a classification file, nor MiniLM on plain text
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=f.id,
            extra_body={"privacy": {"target_epsilon": 3.0}},
        )


def test_composition_is_not_a_sum(server):
    """Two jobs on one budgeted file: the file's committed ε is their PLD composition."""
    client = server.client(server.key("compose"))
    f = client.files.create(
        file=("t.jsonl", labelled_lines(100)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "10"},
    )
    jobs = [
        client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=f.id,
            hyperparameters={"n_epochs": 1, "batch_size": 10},
            extra_body={"privacy": {"target_epsilon": eps, "clipping": {"method": "exact"}}},
        )
        for eps in (1.0, 2.0)
    ]
    from dprc_core.accounting import PrivacyEvent

    budget = client.files.retrieve(f.id).model_extra["budget"]
    events = [
        PrivacyEvent(
            j.model_extra["privacy"]["noise_multiplier"],
            j.model_extra["privacy"]["sample_rate"],
            j.model_extra["privacy"]["steps"],
        )
        for j in jobs
    ]
    composed = epsilon_for_events(events, budget["delta"])
    # the file's history is composed incrementally on its own grid: the same ε up to the
    # discretisation (tests/dprc_core/accounting/test_history.py)
    assert budget["committed"] == pytest.approx(composed, rel=1e-3)
    singles = [epsilon_for_events([e], budget["delta"]) for e in events]
    assert composed < sum(singles)
