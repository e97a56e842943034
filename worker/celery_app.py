"""Celery app for GPU workers (Redis broker, ``DPRC_BROKER_URL``).

Run one process per GPU::

    celery -A worker.celery_app worker -Q gpu --concurrency 1 --prefetch-multiplier 1

Jobs with ``devices: N`` > 1 go to the queue ``gpu-N``; a worker that gives one job D devices
(``DPRC_WORKER_DEVICES=D``, its ranks on ``cuda:0..D-1``) consumes ``gpu,gpu-2,…,gpu-D``
(:func:`worker_queues`; ``python -m worker.celery_app queues`` prints that list)::

    DPRC_WORKER_DEVICES=4 celery -A worker.celery_app worker -Q gpu,gpu-2,gpu-3,gpu-4 \
        --concurrency 1 --prefetch-multiplier 1

Jobs with ``nodes`` > 1 go to the queue ``gpu-nodes``, consumed by the workers that launch
through Ray (``DPRC_LAUNCHER=ray``): such a worker drives the job's ranks on the Ray cluster
(:mod:`worker.ranks`) and keeps its lease and heartbeat, as for a job on its own devices.

``acks_late`` with ``prefetch_multiplier=1``: a message is acknowledged only after its job has
finished (or was found held by a live worker), and a worker takes one job at a time. The Redis
visibility timeout is longer than any job (``DPRC_VISIBILITY_TIMEOUT_SECONDS``, default 7 days),
so a running job is not redelivered under a live worker; a worker that dies is noticed through
its job's expired lease instead: every worker sweeps the store every ``DPRC_SWEEP_SECONDS`` and
re-enqueues such jobs, which resume from their last checkpoint. CUDA is touched only inside the
task (the runner picks the device; CPU when there is none).

This module is the worker process's composition root: it opens the store from ``service``
settings and configures logging (``DPRC_LOG_LEVEL``) in place of Celery's own. The API
process enqueues through :class:`CeleryDispatcher`.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Any

from celery import Celery, signals

from service.base.logging_setup import configure_logging, log_context
from service.base.settings import Settings
from service.data.private_data import restrict_new_files
from service.data.rekey import open_current_store
from service.jobs.lifecycle import runnable_jobs
from service.store.store import Store
from service.synthetic import synthetic_runs

TASK_NAME = "dprc.run_job"
QUEUE = "gpu"
log = logging.getLogger(__name__)


def make_celery(settings: Settings) -> Celery:
    if not settings.broker_url:
        raise RuntimeError("DPRC_BROKER_URL is not set: Celery workers need a Redis broker")
    celery = Celery("dprc", broker=settings.broker_url)
    celery.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        task_routes={TASK_NAME: {"queue": QUEUE}},
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_seconds},
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
    )
    return celery


def queue_for(devices: int, nodes: int = 1) -> str:
    """The queue of jobs that train on ``devices`` devices (of ``nodes`` hosts)."""
    if nodes > 1:
        return f"{QUEUE}-nodes"
    return QUEUE if devices <= 1 else f"{QUEUE}-{devices}"


def worker_queues(settings: Settings) -> str:
    """The ``-Q`` list of a worker that gives one job ``settings.worker_devices`` devices
    (and, launching through Ray, takes the jobs on several hosts)."""
    queues = [queue_for(n) for n in range(1, settings.worker_devices + 1)]
    if settings.worker_nodes > 1:
        queues.append(queue_for(1, settings.worker_nodes))
    return ",".join(queues)


def enqueue(celery: Celery, job_id: str, devices: int = 1, nodes: int = 1) -> None:
    celery.send_task(TASK_NAME, args=[job_id], queue=queue_for(devices, nodes))


class CeleryDispatcher:
    """The API process's side of the queue: job ids go to the ``gpu`` queue (``gpu-N`` for
    jobs on N devices)."""

    def __init__(self, settings: Settings):
        self.celery = make_celery(settings)

    def submit(self, job_id: str, devices: int = 1, nodes: int = 1) -> None:
        try:
            enqueue(self.celery, job_id, devices, nodes)
        except Exception:  # the broker is down: the workers' sweep starts the job later
            log.exception("could not enqueue job %s; a worker sweep will pick it up", job_id)

    def stop(self) -> None:
        self.celery.close()


@lru_cache
def _store() -> Store:
    return open_current_store(Settings())


app = make_celery(Settings()) if Settings().broker_url else Celery("dprc")


@signals.setup_logging.connect
def _setup_logging(**_: Any) -> None:
    """Replaces Celery's logging set-up with the service's (``DPRC_LOG_LEVEL``)."""
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)


@app.task(name=TASK_NAME)
def run_job_task(job_id: str) -> str:
    from worker.execution import execute_job  # torch and the runner: only in the task

    store = _store()
    with log_context(job_id=job_id):
        outcome = execute_job(store, job_id)
        log.info("job %s: %s", job_id, outcome)
    for waiting in synthetic_runs.waiting_on(store, job_id):  # its synthetic-data jobs
        enqueue(app, waiting)
    return outcome.value


def _sweep_forever(stop: threading.Event) -> None:
    while not stop.is_set():
        try:  # opening the store too: a failure here must not end the sweeps for good
            store = _store()
            older = store.settings.sweep_seconds
            for job_id, devices, nodes in runnable_jobs(store, queued_older_than=older):
                enqueue(app, job_id, devices, nodes)
            for job_id in synthetic_runs.runnable(store):
                enqueue(app, job_id)
        except Exception:
            log.exception("sweep failed")
        stop.wait(Settings().sweep_seconds)


_sweeper_stop = threading.Event()


@signals.worker_init.connect
def _private_files(**_: object) -> None:
    """Everything this worker writes (checkpoints, resume state): 0600 / 0700."""
    restrict_new_files(Settings().data_dir)


@signals.worker_ready.connect
def _start_sweeper(**_: object) -> None:
    threading.Thread(
        target=_sweep_forever, args=(_sweeper_stop,), daemon=True, name="dprc-sweep"
    ).start()


@signals.worker_shutdown.connect
def _stop_sweeper(**_: object) -> None:
    _sweeper_stop.set()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["queues"]:
        print(worker_queues(Settings()))
    else:
        print("usage: python -m worker.celery_app queues", file=sys.stderr)
        raise SystemExit(2)
