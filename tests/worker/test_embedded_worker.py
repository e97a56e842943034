"""Jobs run end to end in the embedded worker (SQLite, no broker): the service's default mode,
driven over HTTP with the official openai client."""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest

from dprc_core.accounting import PrivacyLedger, epsilon
from tests.worker.conftest import learnable_lines, wait_for


def _create(client, file_id, **kw):
    args = dict(
        model="dprc-tiny-llama",
        training_file=file_id,
        hyperparameters={"n_epochs": 2, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32},
        extra_body={
            "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
            "checkpoint_every": 4,
        },
    )
    args.update(kw)
    return client.fine_tuning.jobs.create(**args)


def test_a_job_runs_to_success_and_its_checkpoint_loads(embedded, tmp_path):
    from transformers import AutoModelForCausalLM

    client = embedded.client(embedded.key("e2e"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    # batches of 24 (noise σ·C/B per coordinate about a third of B = 8's at the same steps):
    # the loss falls within 12 steps whatever the job's secret seed draws (8 of 8 runs; at
    # B = 8 it rose in 7 of 14, the step noise outweighing the signal)
    hp = {"n_epochs": 6, "batch_size": 24, "learning_rate": 0.01, "max_seq_len": 32}
    job = _create(client, f.id, hyperparameters=hp)
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.model_extra.get("error") or job
    priv = job.model_extra["privacy"]
    assert priv["steps"] == 12  # ceil(6 · 48 / 24)
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    steps = sorted(c.step_number for c in ckpts)
    assert steps == [4, 8, 12]
    last = max(ckpts, key=lambda c: c.step_number)
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        assert not any(n.startswith("resume") for n in names)  # the noise state stays private
        tar.extractall(tmp_path / "ckpt", filter="data")
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "ckpt" / "model", use_safetensors=True, trust_remote_code=False
    )
    assert model.num_parameters() > 0
    ledger = PrivacyLedger.from_json((tmp_path / "ckpt" / "ledger.json").read_text())
    delta = priv["target_delta"]
    eps = ledger.epsilon(delta)
    assert sum(e.steps for e in ledger.events) == 12
    assert eps <= 8.0
    # the accountant, called independently on the job's plan, gives the ledger's ε
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        12,
        delta,
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert abs(eps - want) <= 1e-9 * want
    assert abs(priv["epsilon_spent"] - eps) <= 1e-9 * eps
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    losses = [
        e.data["train_loss"]
        for e in sorted(events, key=lambda e: e.created_at)
        if e.data and "train_loss" in e.data and e.message.startswith("Step")
    ]
    assert len(losses) >= 10 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    # the budget settled to what ran: nothing reserved, spent = the job's ε
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert abs(budget["spent"] - eps) <= 1e-6 * eps and budget["reserved"] == 0


def test_cancel_mid_run_ends_cancelled_with_a_final_checkpoint(embedded):
    client = embedded.client(embedded.key("cancel"))
    f = client.files.create(file=("train.jsonl", learnable_lines(48)), purpose="fine-tune")
    job = _create(
        client,
        f.id,
        hyperparameters={"n_epochs": 30, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32},
    )
    deadline = time.monotonic() + 300
    while True:
        now = client.fine_tuning.jobs.retrieve(job.id)
        if (
            now.model_extra["steps_done"] >= 2
            or now.status != "running"
            and (now.status != "queued")
        ):
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    client.fine_tuning.jobs.cancel(job.id)
    job = wait_for(client, job.id, {"cancelled", "succeeded", "failed"})
    assert job.status == "cancelled"
    priv = job.model_extra["privacy"]
    done = job.model_extra["steps_done"]
    assert 2 <= done < priv["steps"]
    steps = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert max(steps) == done  # the final checkpoint is the step it stopped at
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        done,
        priv["target_delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert abs(priv["epsilon_spent"] - want) <= 1e-9 * want


def test_a_file_that_tokenizes_to_nothing_fails_with_a_clear_message(embedded):
    client = embedded.client(embedded.key("fail"))
    lines = "\n".join(json.dumps({"text": "x"}) for _ in range(20)).encode()
    f = client.files.create(
        file=("one.jsonl", lines), purpose="fine-tune", extra_body={"epsilon_budget": 5.0}
    )
    job = _create(client, f.id, extra_body={"privacy": {"target_epsilon": 4.0}})
    job = wait_for(client, job.id, {"failed", "succeeded", "cancelled"})
    assert job.status == "failed"
    err = job.error
    assert err.code == "invalid_training_file" and "tokenizes to 1 token" in err.message
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0 and budget["spent"] == 0  # nothing ran


def test_a_model_removed_from_disk_fails_the_job_and_releases_the_budget(tmp_path):
    """Same task code, called directly on a store without a running worker."""
    import shutil

    from dprc_core.training.tiny import build_tiny_llama
    from service.base.settings import ModelSpec
    from tests.api.conftest import _serve, _settings
    from worker.execution import execute_job

    folder = build_tiny_llama(tmp_path / "my-lm", hidden=32)
    settings = _settings(
        tmp_path / "data",
        None,
        builtin_models=False,
        models={"my-lm": ModelSpec(path=folder, task="causal_lm")},
    )
    server_gen = _serve(settings)
    server = next(server_gen)
    try:
        client = server.client(server.key("gone"))
        f = client.files.create(
            file=("t.jsonl", learnable_lines(24)),
            purpose="fine-tune",
            extra_body={"epsilon_budget": 6.0},
        )
        job = client.fine_tuning.jobs.create(
            model="my-lm",
            training_file=f.id,
            hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 16},
            extra_body={"privacy": {"target_epsilon": 5.0}},
        )
        assert client.files.retrieve(f.id).model_extra["budget"]["reserved"] > 0
        shutil.rmtree(folder)
        assert execute_job(server.store, job.id) == "failed"
        job = client.fine_tuning.jobs.retrieve(job.id)
        assert job.status == "failed" and job.error.code == "model_not_found"
        assert "my-lm" in job.error.message
        budget = client.files.retrieve(f.id).model_extra["budget"]
        assert budget["reserved"] == 0 and budget["spent"] == 0
    finally:
        server_gen.close()


def test_pause_then_resume_continues_from_the_checkpoint(embedded):
    client = embedded.client(embedded.key("pause"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    job = _create(
        client,
        f.id,
        hyperparameters={"n_epochs": 4, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32},
    )
    deadline = time.monotonic() + 300
    while client.fine_tuning.jobs.retrieve(job.id).model_extra["steps_done"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    client.fine_tuning.jobs.pause(job.id)
    paused = wait_for(client, job.id, {"paused", "succeeded", "failed", "cancelled"})
    assert paused.status == "paused"
    at = paused.model_extra["steps_done"]
    assert at < paused.model_extra["steps_total"] == 24
    steps = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert max(steps) == at  # paused with a checkpoint at the step it stopped
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] > 0  # a paused job keeps its reservation
    time.sleep(1.0)
    assert client.fine_tuning.jobs.retrieve(job.id).model_extra["steps_done"] == at  # frees it
    client.fine_tuning.jobs.resume(job.id)
    done = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert done.status == "succeeded"
    priv = done.model_extra["privacy"]
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        24,
        priv["target_delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert abs(priv["epsilon_spent"] - want) <= 1e-9 * want  # the ledger stayed exact
    started = [
        e.message
        for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data
        if e.message.startswith("Job started")
    ]
    assert len(started) == 2


def test_a_nu_dpftrl_job_runs_through_the_service(embedded):
    from dprc_core.accounting import dpftrl_epsilon

    client = embedded.client(embedded.key("ftrl"))
    f = client.files.create(
        file=("train.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    noise = {"mechanism": "nu_dpftrl", "nu": 0.1, "bands": 4}
    import openai
    import pytest

    with pytest.raises(openai.BadRequestError, match="exact"):
        client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            extra_body={
                "privacy": {
                    "target_epsilon": 8.0,
                    "noise": noise,
                    "clipping": {"method": "hutch", "k": 16},
                }
            },
        )
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 2, "batch_size": 12, "learning_rate": 0.01, "max_seq_len": 32},
        extra_body={
            "privacy": {"target_epsilon": 8.0, "noise": noise, "clipping": {"method": "exact"}},
            "checkpoint_every": 4,
        },
    )
    priv = job.model_extra["privacy"]
    assert priv["steps"] == 8 and priv["noise"]["min_separation"] == 4  # 2 epochs × ⌈48/12⌉
    want = dpftrl_epsilon(
        priv["noise_multiplier"],
        priv["target_delta"],
        0.1,
        steps=8,
        participations=2,
        min_separation=4,
        bands=4,
    )
    assert want <= 8.0 and abs(priv["planned_epsilon"] - want) <= 1e-9 * want
    job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.error
    eps = job.model_extra["privacy"]["epsilon_spent"]
    assert abs(eps - want) <= 1e-9 * want
    budget = client.files.retrieve(f.id).model_extra["budget"]
    assert budget["reserved"] == 0 and abs(budget["spent"] - want) <= 1e-6 * want


def test_a_chunked_upload_is_trained_on_once_a_data_owner_approves_it(embedded, tmp_path):
    """Issue 40: the official client's ``upload_file_chunked`` (no extra fields) of a trainer
    lands pending; a data owner approves it; the job trains to success and its ε is what the
    approved budget was charged (one job: the group's spent is the job's, at the one δ)."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(learnable_lines(48).replace(b'"}', b' chunked"}'))
    trainer = embedded.client(embedded.key("chunks", "trainer"))
    done = trainer.uploads.upload_file_chunked(
        file=path, mime_type="text/jsonl", purpose="fine-tune", part_size=512
    )
    assert done.file is not None
    f = trainer.files.retrieve(done.file.id)
    assert f.model_extra["approval"]["status"] == "pending"
    owner = embedded.client(embedded.key("chunks", "data_owner"))
    approved = owner.post(
        f"/files/{f.id}/approve", body={"epsilon_budget": 9.0, "reason": "ok"}, cast_to=object
    )
    assert approved["budget"]["epsilon"] == 9.0
    job = wait_for(trainer, _create(trainer, f.id).id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.model_extra.get("error") or job
    budget = trainer.files.retrieve(f.id).model_extra["budget"]
    privacy = job.model_extra["privacy"]
    assert budget["delta"] == privacy["target_delta"]
    assert budget["spent"] == pytest.approx(privacy["epsilon_spent"], rel=1e-6)
    assert 0 < budget["spent"] <= 9.0
