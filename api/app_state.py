"""What a request handler reads from the running app: the store and the dispatcher, put on
``app.state`` at start-up by :func:`api.app.create_app`."""

from __future__ import annotations

from fastapi import Request

from service.jobs.dispatch import Dispatcher
from service.store.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher
