"""Handing queued jobs to workers. The job row is the truth; the queue only carries job ids.

* ``DPRC_BROKER_URL`` set: the id goes to the Celery ``gpu`` queue (``worker.celery_app``).
* No broker and ``DPRC_EMBEDDED_WORKER`` (default): an in-process worker thread runs it with
  the same task code (``worker.embedded``).
* Neither: jobs stay ``queued`` until a worker's sweep picks them up.
"""

from __future__ import annotations

import logging
from typing import Protocol

from api.common import Store

log = logging.getLogger("dprc.api")


class Dispatcher(Protocol):
    def submit(self, job_id: str) -> None: ...

    def stop(self) -> None: ...


class CeleryDispatcher:
    def __init__(self, store: Store):
        from worker.celery_app import make_celery

        self.celery = make_celery(store.settings)

    def submit(self, job_id: str) -> None:
        from worker.celery_app import enqueue

        try:
            enqueue(self.celery, job_id)
        except Exception:  # the broker is down: the workers' sweep starts the job later
            log.exception("could not enqueue job %s; a worker sweep will pick it up", job_id)

    def stop(self) -> None:
        self.celery.close()


class NoDispatcher:
    def submit(self, job_id: str) -> None:
        return None

    def stop(self) -> None:
        return None


def make_dispatcher(store: Store) -> Dispatcher:
    settings = store.settings
    if settings.broker_url:
        return CeleryDispatcher(store)
    if settings.embedded_worker:
        from worker.embedded import EmbeddedWorker

        return EmbeddedWorker(store).start()
    return NoDispatcher()
