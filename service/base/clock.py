"""Time as the store keeps it: Unix seconds for records, aware UTC datetimes for leases."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now() -> int:
    """Unix time in whole seconds (``created_at``, ``finished_at``, ...)."""
    return int(time.time())


def utc_now() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime | None) -> datetime | None:
    """``moment`` as an aware UTC datetime: SQLite returns naive datetimes (stored as UTC)."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment
