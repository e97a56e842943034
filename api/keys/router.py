"""``GET /v1/me``: who the key belongs to (keys themselves are managed with ``dprc keys``)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from api.keys.dependencies import CallerDep

router = APIRouter(prefix="/v1", tags=["keys"])


class Me(BaseModel):
    object: str = "api_key"
    key_id: str
    tenant: str


@router.get("/me", response_model=Me)
def me(caller: CallerDep) -> Me:
    return Me(key_id=caller.key_id, tenant=caller.tenant_name)
