"""Small helpers shared by the domains: ids, clocks, request-scoped dependencies."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.settings import Settings


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


@dataclass(frozen=True)
class Store:
    """What the domains need from the running app: settings and a session factory."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.store.sessions() as session:
        yield session
