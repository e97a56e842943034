"""Jobs read their data from the tokenized store on the data volume (issue 28.2): the first job
on a file builds it and says so in its events, a second job on the same file reuses it (the
store's build count stays 1), and deleting the file removes what was derived from it; SQLite
and PostgreSQL, the embedded worker (the same task code as Celery)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dprc_core.training import token_store
from service.data.private_data import token_store_dir
from service.store.tables import Tenant
from tests.api.conftest import Server
from tests.worker.conftest import learnable_lines, serve_embedded, wait_for


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "tokens")


def _job(client, file_id: str):
    return client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=file_id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 16},
        extra_body={"privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}}},
    )


def _events(client, job_id: str) -> list[str]:
    return [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100).data]


def test_a_second_job_on_the_same_file_reuses_the_store(served):
    client = served.client(served.key("tokens"))
    with served.store.sessions() as session:
        tenant_id = session.query(Tenant.id).filter(Tenant.name == "tokens").scalar()
    root = token_store_dir(served.settings.data_dir, tenant_id)
    f = client.files.create(
        file=("train.jsonl", learnable_lines(40)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    first = _job(client, f.id)
    assert wait_for(client, first.id, {"succeeded", "failed"}).status == "succeeded"
    assert any(m.startswith("Tokenized 40 of 40 examples") for m in _events(client, first.id))
    logged = (root / token_store.BUILDS_LOG).read_text().splitlines()
    assert len(logged) == 1
    second = _job(client, f.id)
    assert wait_for(client, second.id, {"succeeded", "failed"}).status == "succeeded"
    events = _events(client, second.id)
    assert any(m.startswith("Reusing the tokenized data (40 examples)") for m in events)
    assert not any(m.startswith("Tokenized") for m in events)
    assert (root / token_store.BUILDS_LOG).read_text().splitlines() == logged  # no new build
    assert len(list(root.glob("*/meta.json"))) == 1
    client.files.delete(f.id)
    assert not list(root.glob("*/meta.json"))  # derived from the deleted file: removed


def test_a_big_file_s_store_is_built_by_a_child_process(served, monkeypatch):
    """At STORE_CHILD_BYTES or more the worker builds the stores in a child process (its
    memory returned on exit) and the run opens the finished store: with an in-process build
    made to fail here, the job still succeeds, tells the child's tokenizing progress, and the
    store was built once. A data error in the child fails the job with the in-process code."""
    from worker import ranks

    monkeypatch.setattr(ranks, "STORE_CHILD_BYTES", 0)  # every file counts as big

    def no_build_here(*args, **kwargs):
        raise AssertionError("the store was built in the worker's own process")

    monkeypatch.setattr(token_store, "_build", no_build_here)
    client = served.client(served.key("tokens"))
    f = client.files.create(
        file=("child.jsonl", learnable_lines(48)),
        purpose="fine-tune",
        extra_body={"epsilon_budget": 9.0},
    )
    job = _job(client, f.id)
    done = wait_for(client, job.id, {"succeeded", "failed"})
    assert done.status == "succeeded", done.error
    events = _events(client, job.id)
    assert any(m.startswith("Tokenized 48 of 48 examples") for m in events)
    assert any(m.startswith("Reusing the tokenized data (48 examples)") for m in events)
    # prompt-completion lines whose completion the 16-token window cuts off: the child's
    # build refuses them, and the job fails as an in-process build would
    long_prompt = "".join(
        json.dumps({"prompt": "word " * 60, "completion": " yes"}) + "\n" for _ in range(24)
    ).encode()
    bad = client.files.create(
        file=("cut.jsonl", long_prompt), purpose="fine-tune", extra_body={"epsilon_budget": 9.0}
    )
    failed = wait_for(client, _job(client, bad.id).id, {"succeeded", "failed"})
    assert failed.status == "failed"
    assert failed.error.code == "invalid_training_file", failed.error
