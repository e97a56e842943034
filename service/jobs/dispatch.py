"""Handing queued jobs to workers. The job row is the truth; the dispatcher only carries job
ids, and a job it never delivers is still found by the workers' sweep
(:func:`service.jobs.lifecycle.runnable_job_ids`).

Which dispatcher a process uses is chosen where it is composed (``dprc serve``:
:func:`dprc.app.make_dispatcher`): the Celery queue, the embedded worker thread or none."""

from __future__ import annotations

from typing import Protocol


class Dispatcher(Protocol):
    def submit(self, job_id: str, devices: int = 1, nodes: int = 1) -> None:
        """Hand ``job_id`` (which trains on ``devices`` devices of ``nodes`` hosts) to a worker
        that fits it."""
        ...

    def stop(self) -> None: ...


class NoDispatcher:
    """No worker in this process and no broker: jobs wait for a worker's sweep."""

    def submit(self, job_id: str, devices: int = 1, nodes: int = 1) -> None:
        return None

    def stop(self) -> None:
        return None
