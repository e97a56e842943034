"""The app ``dprc serve`` runs: the HTTP API with the dispatcher the settings call for.

* ``DPRC_BROKER_URL`` set: job ids go to the Celery ``gpu`` queue (``worker.celery_app``).
* No broker and ``DPRC_EMBEDDED_WORKER`` (default): an in-process worker thread runs them with
  the same task code (``worker.embedded``).
* Neither: jobs stay ``queued`` until a worker's sweep picks them up.
"""

from __future__ import annotations

from fastapi import FastAPI

from api.app import create_app
from service.base.settings import Settings, get_settings
from service.jobs.dispatch import Dispatcher, NoDispatcher
from service.store.store import Store


def make_dispatcher(store: Store) -> Dispatcher:
    settings = store.settings
    if settings.broker_url:
        from worker.celery_app import CeleryDispatcher  # Celery only when a broker is set

        return CeleryDispatcher(settings)
    if settings.embedded_worker:
        from worker.embedded import EmbeddedWorker  # torch only when jobs run here

        return EmbeddedWorker(store).start()
    return NoDispatcher()


def build_app(settings: Settings | None = None) -> FastAPI:
    return create_app(settings or get_settings(), dispatcher=make_dispatcher)
