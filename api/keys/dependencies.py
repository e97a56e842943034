"""The request's caller (tenant), from its bearer key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.keys.service import Caller, authenticate

_bearer = HTTPBearer(auto_error=False, description="an API key from `dprc keys create`")


def current_caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    with request.app.state.store.sessions() as session:
        return authenticate(session, request.headers.get("authorization"))


CallerDep = Annotated[Caller, Depends(current_caller)]
