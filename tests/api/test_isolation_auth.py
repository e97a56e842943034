"""Tenant isolation (another tenant's resource is a 404, never a 403) and authentication."""

from __future__ import annotations

import io
import tarfile

import openai
import pytest

from service.governance.keys import revoke_key
from service.jobs import job_runs
from service.store.tables import ApiKey
from tests.api.conftest import labelled_lines


@pytest.fixture()
def a_resources(server, tmp_path):
    a = server.client(server.key("tenant-a"))
    f = a.files.create(
        file=("a.jsonl", labelled_lines(40)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": "5"},
    )
    job = a.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 8},
        extra_body={"privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}}},
    )
    archive = tmp_path / "c.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))
    job_runs.record_checkpoint(server.store, job.id, 1, 0.1, archive)
    ckpt = a.fine_tuning.jobs.checkpoints.list(job.id).data[0]
    return a, f, job, ckpt


def test_other_tenant_gets_404(server, a_resources):
    _a, f, job, ckpt = a_resources
    b = server.client(server.key("tenant-b"))
    calls = [
        lambda: b.files.retrieve(f.id),
        lambda: b.files.content(f.id),
        lambda: b.files.delete(f.id),
        lambda: b.files.content(ckpt.model_extra["file_id"]),
        lambda: b.post(f"/files/{f.id}/budget", body={"epsilon_budget": 50}, cast_to=object),
        lambda: b.fine_tuning.jobs.retrieve(job.id),
        lambda: b.fine_tuning.jobs.cancel(job.id),
        lambda: b.fine_tuning.jobs.list_events(job.id),
        lambda: b.fine_tuning.jobs.checkpoints.list(job.id),
        lambda: b.get(f"/fine_tuning/jobs/{job.id}/ledger", cast_to=object),
        lambda: b.fine_tuning.jobs.list(after=job.id),
        lambda: b.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=f.id,
            extra_body={"privacy": {"target_epsilon": 1.0}},
        ),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    assert [x.id for x in b.files.list()] == []
    assert b.fine_tuning.jobs.list().data == []


def test_owner_still_sees_everything(server, a_resources):
    a, f, job, _ckpt = a_resources
    assert a.files.retrieve(f.id).id == f.id
    assert a.fine_tuning.jobs.retrieve(job.id).status == "queued"


@pytest.mark.parametrize("header", [None, "Bearer", "Basic abc", "Bearer dprc-not-a-key"])
def test_missing_or_invalid_key_is_401(server, header):
    with server.http(None) as http:
        headers = {"Authorization": header} if header else {}
        for method, path in [
            ("GET", "/v1/files"),
            ("GET", "/v1/models"),
            ("GET", "/v1/fine_tuning/jobs"),
            ("GET", "/v1/fine_tuning/jobs/x"),
            ("POST", "/v1/accountant/epsilon"),
        ]:
            r = http.request(method, path, headers=headers)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["type"] == "authentication_error"


def test_revoked_key_is_401(server):
    key = server.key("revoked")
    client = server.client(key)
    client.models.list()
    with server.store.sessions() as session:
        from service.governance.keys import hash_key

        key_id = session.query(ApiKey).filter_by(key_hash=hash_key(key)).one().id
        assert revoke_key(session, key_id)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").files.list()


def test_keys_are_stored_hashed(server):
    key = server.key("hashed")
    with server.store.sessions() as session:
        stored = [k.key_hash for k in session.query(ApiKey)]
    assert key not in stored and all(len(h) == 64 for h in stored)
