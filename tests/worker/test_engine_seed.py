"""The job's seed (which the API returns) is not the engine's: the worker keys it with the data
folder's run secret, so reading the job object does not give what the seed drives."""

from __future__ import annotations

import stat
from collections.abc import Iterator

import pytest

from service.data.private_data import engine_seed
from service.jobs import job_runs
from tests.api.conftest import Server, _serve, _settings
from tests.worker.conftest import learnable_lines
from worker.execution import build_spec


@pytest.fixture(scope="module")
def no_worker(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-seed"), None))


def test_the_engine_seed_is_keyed_by_the_run_secret(no_worker, tmp_path):
    client = no_worker.client(no_worker.key("seed"))
    f = client.files.create(file=("train.jsonl", learnable_lines(16)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 4, "max_seq_len": 32},
        extra_body={"privacy": {"target_epsilon": 8.0}},
        seed=7,
    )
    assert job.seed == 7  # what the client asked for, echoed as OpenAI does
    store = no_worker.store
    spec = build_spec(store, job_runs.job_request(store, job.id))
    assert (
        spec.seed != 7 and spec.seed == build_spec(store, job_runs.job_request(store, job.id)).seed
    )
    assert spec.seed == engine_seed(store.settings.data_dir, 7)
    assert engine_seed(tmp_path, 7) != spec.seed  # another data folder: another secret
    key = store.settings.data_dir / "secrets" / "run.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
