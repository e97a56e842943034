"""Fine-tuned models as in OpenAI's API (issue 33, point 7), with the embedded worker on SQLite
and PostgreSQL through uvicorn and the official ``openai`` client: a succeeded job names its
model ``ft:<base>:<tenant>:<suffix>:<job id>``, ``GET /v1/models`` lists it for its tenant only,
and it is the base of a later job, whose worker starts from exactly its released weights."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterator

import openai
import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import load_file

from tests.api.conftest import Server
from tests.worker.conftest import learnable_lines, serve_embedded, wait_for

HP = {"n_epochs": 1, "batch_size": 8, "learning_rate": 0.01, "max_seq_len": 32}
PRIVACY = {"privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}}}
ENDED = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "ft")


def _train(client, tag: str, hp: dict = HP, uploader=None, **extra):
    """Upload a data set (by ``uploader``, a data owner, when ``client`` is a trainer's: a
    trainer's upload waits for approval) and train on it with ``client``."""
    lines = learnable_lines(24).replace(b'"}', f' {tag}"}}'.encode())
    f = (uploader or client).files.create(
        file=(f"{tag}.jsonl", lines), purpose="fine-tune", extra_body={"epsilon_budget": 9.0}
    )
    job = client.fine_tuning.jobs.create(
        training_file=f.id, hyperparameters=hp, extra_body=PRIVACY, **extra
    )
    job = wait_for(client, job.id, ENDED)
    assert job.status == "succeeded", job.model_extra.get("error") or job
    return job


def _archive_weights(client, job) -> dict:
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    last = max(ckpts, key=lambda c: c.step_number)
    archive = client.files.content(last.model_extra["file_id"]).read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("model/model.safetensors")
        assert member is not None
        return load_safetensors(member.read())


def test_a_succeeded_job_names_a_model_its_tenant_lists_and_trains_on(served):
    tenant = f"Acme Labs {served.settings.data_dir.name}"
    alice = served.client(served.key(tenant, role="trainer"))
    owner = served.client(served.key(tenant, role="data_owner"))
    bob = served.client(served.key(f"other {served.settings.data_dir.name}"))

    first = _train(alice, "first", model="dprc-tiny-llama", suffix="first_run", uploader=owner)
    slug = re.sub(r"[^a-z0-9-]+", "-", tenant.lower()).strip("-")
    name = f"ft:dprc-tiny-llama:{slug}:first_run:{first.id}"
    assert first.fine_tuned_model == name

    listed = {m.id: m for m in alice.models.list().data}
    assert name in listed and "dprc-tiny-llama" in listed
    assert listed[name].owned_by == tenant
    assert alice.models.retrieve(name).id == name
    # another tenant: not listed, 404 to read and to train on
    assert name not in {m.id for m in bob.models.list().data}
    with pytest.raises(openai.NotFoundError):
        bob.models.retrieve(name)
    bob_file = bob.files.create(
        file=("b.jsonl", learnable_lines(24)), purpose="fine-tune", extra_body={"epsilon_budget": 5}
    )
    with pytest.raises(openai.NotFoundError) as refused:
        bob.fine_tuning.jobs.create(
            model=name, training_file=bob_file.id, hyperparameters=HP, extra_body=PRIVACY
        )
    assert refused.value.body["code"] == "model_not_found"

    # the fine-tuned model is the base of a later job, which starts from its released weights
    second = _train(alice, "second", model=name, uploader=owner)
    assert second.model == name
    assert second.fine_tuned_model == f"ft:dprc-tiny-llama:{slug}::{second.id}"  # root base
    unpacked = load_file(served.settings.models_dir / "fine-tuned" / first.id / "model.safetensors")
    released = _archive_weights(alice, first)
    assert unpacked.keys() == released.keys()
    assert all((unpacked[k] == released[k]).all() for k in released)
    trained = _archive_weights(alice, second)
    assert any(not (trained[k] == released[k]).all() for k in released)  # it trained on

    # the first job's last checkpoint deleted: its weights are gone, so is the model
    ckpts = alice.fine_tuning.jobs.checkpoints.list(first.id).data
    last = max(ckpts, key=lambda c: c.step_number)
    admin = served.client(served.key(tenant, role="admin"))
    admin.files.delete(last.model_extra["file_id"])
    assert name not in {m.id for m in alice.models.list().data}
    with pytest.raises(openai.NotFoundError):
        alice.models.retrieve(name)
    again = owner.files.create(
        file=("c.jsonl", learnable_lines(24).replace(b'"}', b' third"}')),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 5},
    )
    with pytest.raises(openai.NotFoundError):
        alice.fine_tuning.jobs.create(
            model=name, training_file=again.id, hyperparameters=HP, extra_body=PRIVACY
        )


def test_a_lora_fine_tune_is_merged_into_the_base_of_a_later_job(served):
    """A LoRA fine-tune starts a later job (full, or LoRA again: supervised fine-tuning with LoRA,
    then more) with its adapter merged into the model its job started from: the merged weights
    equal W + (alpha / r)·B·A computed here from the adapter's own tensors, and a LoRA fine-tune
    of it is served as its adapter over that merged folder."""
    if served.settings.database_url:
        pytest.skip("merging does not depend on the database: SQLite runs it")
    from service.governance.caller import Caller
    from service.inference.targets import served_model
    from service.models.model_folders import whole_folder
    from service.models.model_registry import registry

    alice = served.client(served.key("lora"))
    first = _train(alice, "lora", model="dprc-tiny-llama", hp={**HP, "lora": {"r": 4}})
    assert first.fine_tuned_model in {m.id for m in alice.models.list().data}
    full = _train(alice, "after-lora", model=first.fine_tuned_model)
    again = _train(alice, "lora-on-lora", model=first.fine_tuned_model, hp={**HP, "lora": {"r": 4}})

    tenant_id = _tenant_id(served, "lora")
    merged = whole_folder(served.store, tenant_id, first.fine_tuned_model)
    base_dir = registry(served.settings).get("dprc-tiny-llama").path
    base = load_file(str(base_dir / "model.safetensors"))
    adapter_dir = served.settings.models_dir / "fine-tuned" / first.id
    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    scale = 16.0 / 4  # the Lora schema's default alpha over r
    got = load_file(str(merged / "model.safetensors"))
    changed = 0
    for name, w in base.items():
        stem = name.removesuffix(".weight")
        a_key = next((k for k in adapter if k.endswith(f"{stem}.lora_A.weight")), None)
        want = w
        if a_key is not None:
            b = adapter[a_key.replace("lora_A", "lora_B")]
            want = w + scale * b @ adapter[a_key]
            changed += 1
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-6)
    assert changed >= 2  # q_proj and v_proj of each block

    caller = Caller(tenant_id, "lora", "key-test", "viewer")
    target = served_model(served.store, caller, again.fine_tuned_model)
    assert target.lora and target.base_path == merged  # its adapter over the merged start
    assert full.status == again.status == "succeeded"


def _tenant_id(served: Server, name: str) -> int:
    from sqlalchemy import select

    from service.store.tables import Tenant

    with served.store.sessions() as session:
        tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    assert tenant_id is not None
    return int(tenant_id)
