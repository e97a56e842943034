"""The request's caller (tenant), from its bearer key or, for the dashboard, its session
cookie (:mod:`api.dashboard.session`; the bearer key wins when both are sent)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.dashboard.session import check_csrf, session_caller
from service.base.logging_setup import bind
from service.governance.keys import Caller, authenticate

_bearer = HTTPBearer(auto_error=False, description="an API key from `dprc keys create`")


def current_caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    request_id = getattr(request.state, "request_id", None)
    authorization = request.headers.get("authorization")
    if not authorization:
        caller = session_caller(request)
        if caller is not None:
            check_csrf(request)
            return _bound(caller.with_request(request_id))
    with request.app.state.store.sessions() as session:
        return _bound(authenticate(session, authorization).with_request(request_id))


def _bound(caller: Caller) -> Caller:
    """The caller, its tenant and key id added to the request's log context."""
    bind(tenant=caller.tenant_name, key_id=caller.key_id)
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]
