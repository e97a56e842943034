"""A job row stores the engine's mechanism objects (``privacy.mechanisms``) and the worker
builds its engine from exactly them — checked against objects built here by hand from the
request, on SQLite and PostgreSQL, through uvicorn (no worker runs: the jobs stay queued).
A row stored before the objects were (no ``mechanisms``) still builds the same spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from dprc_core.clipping import Auto, Clipping, Exact, Hutch, HutchPP
from dprc_core.noise import Gaussian, NuDPFTRL, noise_from_dict
from service.jobs import job_runs as runs
from service.store.tables import Job as JobRow
from tests.api.conftest import Server, _serve, _settings, text_lines
from worker.execution import build_spec

N = 200


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def queued(request, tmp_path_factory) -> Iterator[Server]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    tmp = tmp_path_factory.mktemp(f"dprc-mech-{request.param}")
    yield from _serve(_settings(tmp, url, secure_rng=True))


CASES = [
    # (privacy request, hyperparameters, the clipping and noise the engine must run, σ aside)
    ({"clipping": {"method": "hutch", "k": 8}}, {}, Clipping(1.0, Hutch(8, "per_example")), "g"),
    (
        {"clipping": {"method": "hutchpp", "k": 4, "sketch": "shared"}, "max_grad_norm": 0.5},
        {},
        Clipping(0.5, HutchPP(4, "shared")),
        "g",
    ),
    ({"clipping": {"method": "exact"}}, {}, Clipping(1.0, Exact()), "g"),
    (
        {"clipping": {"method": "auto", "k": 16}},
        {"max_seq_len": 64},
        Clipping(1.0, Auto(64, 16, "per_example")),
        "g",
    ),
    (
        {
            "clipping": {"method": "exact"},
            "noise": {"mechanism": "nu_dpftrl", "nu": 0.1, "bands": 3},
        },
        {},
        Clipping(1.0, Exact()),
        "nu",
    ),
]


@pytest.mark.parametrize(("privacy", "hp", "clipping", "kind"), CASES)
def test_the_worker_runs_the_objects_the_job_stored(queued, privacy, hp, clipping, kind):
    client = queued.client(queued.key("mech"))
    f = client.files.create(file=("t.jsonl", text_lines(N)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 20, **hp},
        extra_body={"privacy": {"target_epsilon": 3.0, **privacy}},
    )
    priv = job.model_extra["privacy"]
    sigma = priv["noise_multiplier"]
    noise = (
        Gaussian(sigma, secure=True)
        if kind == "g"
        else NuDPFTRL(sigma, nu=privacy["noise"]["nu"], bands=privacy["noise"]["bands"])
    )
    stored = priv["mechanisms"]  # shown on the job object as stored
    assert Clipping.from_dict(stored["clipping"]) == clipping
    assert noise_from_dict(stored["noise"]) == noise

    spec = build_spec(queued.store, runs.job_request(queued.store, job.id))
    assert spec.mechanisms(sigma) == (clipping, noise)

    # the same job as a row written before the objects were stored: the same spec
    with queued.store.sessions() as session:
        row = session.scalar(select(JobRow).where(JobRow.id == job.id))
        assert row is not None
        row.privacy = {k: v for k, v in row.privacy.items() if k != "mechanisms"}
        session.commit()
    legacy = build_spec(queued.store, runs.job_request(queued.store, job.id))
    assert legacy.mechanisms(sigma) == (clipping, noise)
    assert dataclasses.replace(legacy, seed=spec.seed) == spec
    client.fine_tuning.jobs.cancel(job.id)
