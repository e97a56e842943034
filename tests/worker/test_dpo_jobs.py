"""Issue 43 through the service: DP DPO jobs driven by the official ``openai`` client over
uvicorn, on SQLite and PostgreSQL, with the embedded worker (the same task code as Celery).

Preference lines in OpenAI's format are validated at upload (a line without both outputs is
refused with its number); ``method: {"type": "dpo", "dpo": {"hyperparameters": {"beta"}}}`` is
OpenAI's shape and is echoed; a supervised job on preference lines and a DPO job on chat lines
are refused; the job's ε — recomputed here by the accountant from its σ, q and steps — is the
one on every surface (job, events, checkpoints, results CSV, ledger, the file's budget); the
checkpoints carry the validation file's reward margin and accuracy; the reference
log-probabilities (a function of the private data) are in no released archive. On SQLite also:
supervised fine-tuning, then DPO from its ``ft:`` model, each job charging its own file."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator

import openai
import pytest

from dprc_core.accounting import epsilon
from dprc_core.training.results import read_results
from tests.api.conftest import Server
from tests.worker.conftest import serve_embedded, wait_for

ENDED = {"succeeded", "failed", "cancelled"}
PRIVACY = {"privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}}}


def _pair(i: int) -> dict:
    letter = "abcdefgh"[i % 8]
    return {
        "input": {"messages": [{"role": "user", "content": f"echo {letter} #{i}"}]},
        "preferred_output": [{"role": "assistant", "content": letter * 3}],
        "non_preferred_output": [{"role": "assistant", "content": letter.upper() * 3}],
    }


def _jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "dpo")


def _dpo(hp: dict, beta: float | None = None) -> dict:
    inner = dict(hp, beta=beta) if beta is not None else hp
    return {"type": "dpo", "dpo": {"hyperparameters": inner}}


HP = {"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 48}


def test_a_dpo_job_has_one_epsilon_everywhere_and_reward_metrics(served):
    client = served.client(served.key(f"dpo {served.settings.data_dir.name}"))
    rows = [_pair(i) for i in range(24)]
    broken = [*rows[:2], {k: v for k, v in rows[2].items() if k != "non_preferred_output"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("bad.jsonl", _jsonl(broken)), purpose="fine-tune")
    assert "line 3" in refused.value.body["message"]
    assert "non_preferred_output" in refused.value.body["message"]

    f = client.files.create(
        file=("pairs.jsonl", _jsonl(rows)), purpose="fine-tune", extra_body={"epsilon_budget": 9}
    )
    assert f.model_extra["format"] == "preference" and f.model_extra["n_examples"] == 24
    valid = client.files.create(
        file=("held.jsonl", _jsonl([_pair(100 + i) for i in range(6)])), purpose="fine-tune"
    )

    with pytest.raises(openai.BadRequestError) as refused:  # preference lines need dpo
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama", training_file=f.id, hyperparameters=HP, extra_body=PRIVACY
        )
    assert "method dpo" in refused.value.body["message"]
    with pytest.raises(openai.APIStatusError) as refused:  # hyperparameters in one place
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            hyperparameters=HP,
            method=_dpo(HP),
            extra_body=PRIVACY,
        )
    assert refused.value.status_code in (400, 422)

    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        validation_file=valid.id,
        method=_dpo(HP, beta=0.25),
        extra_body=PRIVACY,
    )
    assert job.method.type == "dpo"
    assert job.method.dpo.hyperparameters.beta == 0.25
    priv = job.model_extra["privacy"]
    sigma, q, steps, delta = (
        priv["noise_multiplier"],
        priv["sample_rate"],
        priv["steps"],
        priv["target_delta"],
    )
    assert priv["dataset_size"] == 24  # the pairs: one pair is one unit
    job = wait_for(client, job.id, ENDED, timeout=600)
    assert job.status == "succeeded", job.error
    want = epsilon(sigma, q, steps, delta, "exact", None)
    assert job.model_extra["privacy"]["epsilon_spent"] == pytest.approx(want, rel=1e-9)

    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    progress = sorted(
        (e.data for e in events if e.message.startswith("Step ")), key=lambda d: d["step"]
    )
    assert progress[-1]["step"] == steps
    assert progress[-1]["epsilon_spent"] == pytest.approx(want, rel=1e-9)
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    last = max(ckpts, key=lambda c: c.step_number)
    assert last.model_extra["epsilon"] == pytest.approx(want, rel=1e-9)
    metrics = last.metrics.model_dump() if hasattr(last.metrics, "model_dump") else last.metrics
    metrics = {**metrics, **(getattr(last.metrics, "model_extra", None) or {})}
    assert 0.0 <= metrics["valid_reward_accuracy"] <= 1.0
    assert isinstance(metrics["valid_reward_margin"], float)
    assert metrics["valid_loss"] > 0
    ledger = client.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object)
    assert ledger["epsilon_spent"] == pytest.approx(want, rel=1e-9)
    results = [r for r in job.result_files if r not in {c.model_extra["file_id"] for c in ckpts}]
    assert read_results(client.files.content(results[0]).text)[-1]["epsilon"] == pytest.approx(
        want, rel=1e-9
    )
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0
    assert budget["spent"] == pytest.approx(
        epsilon(sigma, q, steps, budget["delta"], "exact", None), rel=1e-3
    )
    # the reference log-probabilities stay with the private data: in no released archive
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
    assert names and not [n for n in names if "reference" in n or n.endswith(".f64")]


def test_sft_then_dpo_from_the_fine_tuned_model_charges_each_file(served):
    if served.settings.database_url:
        pytest.skip("the ft: start does not depend on the database: SQLite runs it")
    client = served.client(served.key("dpo after sft"))
    chat = [
        {
            "messages": [
                {"role": "user", "content": f"echo {c}"},
                {"role": "assistant", "content": c * 3},
            ]
        }
        for c in "abcdefghijklmnop"
    ]
    sft_file = client.files.create(
        file=("chat.jsonl", _jsonl(chat)), purpose="fine-tune", extra_body={"epsilon_budget": 9}
    )
    pairs = client.files.create(
        file=("pairs.jsonl", _jsonl([_pair(i) for i in range(16)])),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9},
    )
    with pytest.raises(openai.BadRequestError) as refused:  # dpo trains preference lines only
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama", training_file=sft_file.id, method=_dpo(HP), extra_body=PRIVACY
        )
    assert "preference" in refused.value.body["message"]
    sft = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=sft_file.id,
        method={"type": "supervised", "supervised": {"hyperparameters": HP}},
        extra_body=PRIVACY,
    )
    assert sft.method.type == "supervised"
    sft = wait_for(client, sft.id, ENDED, timeout=600)
    assert sft.status == "succeeded", sft.error
    dpo = client.fine_tuning.jobs.create(
        model=sft.fine_tuned_model, training_file=pairs.id, method=_dpo(HP), extra_body=PRIVACY
    )
    assert dpo.method.dpo.hyperparameters.beta == 0.1  # 'auto'
    dpo = wait_for(client, dpo.id, ENDED, timeout=600)
    assert dpo.status == "succeeded", dpo.error
    for file_id, job in ((sft_file.id, sft), (pairs.id, dpo)):
        budget = client.files.retrieve(file_id).model_extra["budget"]
        assert budget["spent"] == pytest.approx(job.model_extra["privacy"]["epsilon_spent"], 1e-3)
