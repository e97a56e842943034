"""Schemas of the keys domain (printed by ``dprc keys list``)."""

from __future__ import annotations

from pydantic import BaseModel


class KeyInfo(BaseModel):
    id: str
    tenant: str
    prefix: str
    created_at: int
    revoked_at: int | None
