"""The keys domain's objects as the API's schemas."""

from __future__ import annotations

from api.keys.schemas import Me, Storage
from service.data.files import Storage as TenantStorage
from service.governance.keys import Caller


def me(caller: Caller, storage: TenantStorage) -> Me:
    return Me(
        key_id=caller.key_id,
        tenant=caller.tenant_name,
        role=caller.role,
        storage=Storage(used_bytes=storage.used_bytes, quota_bytes=storage.quota_bytes),
    )
