"""Small helpers shared by the domains: ids, clocks, request-scoped dependencies."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from sqlalchemy import Engine, Select
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


def cursor_page(
    session: Session,
    query: Select[Any],
    table: Any,
    after: str | None,
    limit: int,
    what: str,
    *,
    descending: bool = True,
) -> tuple[list[Any], bool]:
    """One page of ``query`` (rows of ``table``, which has ``seq`` and ``id`` columns) after
    the row whose id is ``after``, and whether more follow. The cursor must itself be a row of
    ``query`` (so it carries the same tenant / job scoping), else 404."""
    from api.errors import NotFound

    if after:
        anchor = session.scalar(query.with_only_columns(table.seq).where(table.id == after))
        if anchor is None:
            raise NotFound(f"no such {what}: {after[:64]!r}", param="after",
                           code=f"{what}_not_found")
        query = query.where(table.seq < anchor if descending else table.seq > anchor)
    order = table.seq.desc() if descending else table.seq.asc()
    rows = list(session.scalars(query.order_by(order).limit(limit + 1)))
    return rows[:limit], len(rows) > limit
