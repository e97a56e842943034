"""Schemas of the keys domain: who a key belongs to (``GET /v1/me``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Storage(BaseModel):
    used_bytes: int = Field(description="bytes the tenant's files hold (uploads and archives)")
    quota_bytes: int = Field(description="DPRC_TENANT_STORAGE_BYTES")


class Me(BaseModel):
    object: str = "api_key"
    key_id: str
    tenant: str
    role: str = Field(description="admin | data_owner | trainer | viewer (docs/governance.md)")
    storage: Storage = Field(description="the tenant's storage: bytes used and its quota")
