"""The keys domain's objects as the API's schemas."""

from __future__ import annotations

from api.keys.schemas import Me
from service.keys import Caller


def me(caller: Caller) -> Me:
    return Me(key_id=caller.key_id, tenant=caller.tenant_name, role=caller.role)
