"""A job's event log (``GET /v1/fine_tuning/jobs/{id}/events``), written by both sides."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.base.clock import now
from service.base.ids import new_id
from service.store.tables import JobEvent


def add_event(
    session: Session,
    job_id: str,
    message: str,
    *,
    level: str = "info",
    type_: str = "message",
    data: dict[str, Any] | None = None,
) -> None:
    session.add(
        JobEvent(
            id=new_id("ftevent"),
            job_id=job_id,
            created_at=now(),
            level=level,
            type=type_,
            message=message,
            data=data,
        )
    )
