"""Domain errors: what went wrong in the terms of the domain — a ``code``, a message and,
where one input is to blame, its name (``param``). No HTTP here: ``api/errors.py`` maps each
class to a status code and an OpenAI-style error body."""

from __future__ import annotations


class DomainError(Exception):
    """Base class; ``code`` is a stable machine-readable reason (``invalid_value``, ...)."""

    code = "error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidInput(DomainError):
    """A value in the request is not acceptable (bad format, out of range, inconsistent)."""

    code = "invalid_value"


class Unauthenticated(DomainError):
    """No valid credentials."""

    code = "invalid_api_key"


class PermissionDenied(DomainError):
    """Valid credentials whose role may not do this (:mod:`service.governance.roles`)."""

    code = "permission_denied"


class NotFound(DomainError):
    """The named record does not exist (or belongs to another tenant)."""

    code = "not_found"


class Conflict(DomainError):
    """The request does not fit the current state (a used budget, an ended job, ...)."""

    code = "conflict"


class TooLarge(DomainError):
    """An upload exceeds its size limit."""

    code = "too_large"


class LimitReached(DomainError):
    """A per-tenant limit is reached; it frees up when other work ends."""

    code = "limit_reached"
