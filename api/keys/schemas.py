"""Schemas of the keys domain: who a key belongs to (``GET /v1/me``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Me(BaseModel):
    object: str = "api_key"
    key_id: str
    tenant: str
    role: str = Field(description="admin | trainer | viewer (docs/governance.md)")
