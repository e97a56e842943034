"""``GET /v1/me``: who the key belongs to and its role (keys themselves are managed with
``dprc keys`` on the server and by admins under ``/v1/organization/api_keys``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.app_state import get_store
from api.keys import views
from api.keys.dependencies import CallerDep
from api.keys.schemas import Me
from service.data import files

router = APIRouter(prefix="/v1", tags=["keys"])


@router.get("/me", response_model=Me)
def me(caller: CallerDep, request: Request) -> Me:
    return views.me(caller, files.storage(get_store(request), caller))
