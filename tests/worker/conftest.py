"""Worker fixtures: the API with its embedded worker (same task code as Celery) over uvicorn."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.api.conftest import Server, _serve, _settings, pg_url  # noqa: F401  (fixture)


def learnable_lines(n: int) -> bytes:
    """A toy language a tiny model learns in a few steps: repeated two-letter patterns."""
    pats = ["ab", "cd", "ef"]
    return (
        "\n".join(json.dumps({"text": pats[i % 3] * (6 + i % 5)}) for i in range(n)) + "\n"
    ).encode()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Iterator[Server]:
    """SQLite + the embedded worker: the service's default, nothing else running."""
    tmp = tmp_path_factory.mktemp("dprc-embedded")
    yield from _serve(
        _settings(
            tmp,
            None,
            embedded_worker=True,
            lease_seconds=6,
            sweep_seconds=2,
            max_physical_batch_size=8,
        )
    )


def serve_embedded(request, tmp_path_factory, name: str, **settings: object) -> Iterator[Server]:
    """The API with its embedded worker on the fixture's parameter, ``sqlite`` or
    ``postgresql``, with the small leases and batches of these tests and ``settings``."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    tmp = tmp_path_factory.mktemp(f"dprc-{name}-{request.param}")
    yield from _serve(
        _settings(
            tmp,
            url,
            embedded_worker=True,
            lease_seconds=6,
            sweep_seconds=2,
            max_physical_batch_size=8,
            **settings,
        )
    )


def wait_for(client, job_id: str, statuses: set[str], timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.status}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory) -> Iterator[Server]:
    """SQLite + an embedded worker that gives a job 2 (CPU) devices."""
    yield from _serve(
        _settings(
            tmp_path_factory.mktemp("dprc-devices"),
            None,
            embedded_worker=True,
            lease_seconds=6,
            sweep_seconds=1,
            max_physical_batch_size=4,
            worker_devices=2,
            device="cpu",
        )
    )
