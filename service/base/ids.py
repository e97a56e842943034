"""Record ids: a prefix naming the kind of record and 96 random bits."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"
