"""Who makes a request (:class:`Caller`): made by :mod:`service.governance.keys` when a key or a
dashboard session is authenticated, checked by :mod:`service.governance.roles`, recorded by
:mod:`service.governance.audit`."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Caller:
    """Who makes a request: the key's tenant, the key and its role
    (:mod:`service.governance.roles`), and
    the request's id (``X-Request-ID``) that the audit log records."""

    tenant_id: int
    tenant_name: str
    key_id: str
    role: str
    request_id: str | None = None

    def with_request(self, request_id: str | None) -> Caller:
        return replace(self, request_id=request_id)
