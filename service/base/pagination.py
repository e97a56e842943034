"""Cursor pagination over rows that have an increasing ``seq`` and a public ``id``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from service.base.errors import NotFound


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
    ``query`` (so it carries the same tenant / job scoping), else :class:`NotFound`."""
    if after:
        anchor = session.scalar(query.with_only_columns(table.seq).where(table.id == after))
        if anchor is None:
            raise NotFound(
                f"no such {what}: {after[:64]!r}", param="after", code=f"{what}_not_found"
            )
        query = query.where(table.seq < anchor if descending else table.seq > anchor)
    order = table.seq.desc() if descending else table.seq.asc()
    rows = list(session.scalars(query.order_by(order).limit(limit + 1)))
    return rows[:limit], len(rows) > limit
