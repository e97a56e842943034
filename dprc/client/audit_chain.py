"""The audit log's hash chain, recomputed on the client from the API's listing (the spec in
docs/governance.md, implemented here on its own: the client trusts no server code).

Each entry's ``hash`` is SHA-256 (hex) over the UTF-8 bytes of the JSON array
``[prev_hash, id, created_at, key_id, role, action, resource, request_id, detail]`` written
with sorted keys, no spaces and ASCII escapes; the first entry's ``prev_hash`` is 64 zeros and
every other's is the ``hash`` of the entry before it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GENESIS = "0" * 64
HASHED = (
    "prev_hash",
    "id",
    "created_at",
    "key_id",
    "role",
    "action",
    "resource",
    "request_id",
    "detail",
)


def chain_hash(entry: Mapping[str, Any]) -> str:
    """The hash ``entry`` should carry, from its other fields."""
    payload = [entry.get(name) for name in HASHED]
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Verdict:
    """``problem`` is None when the chain holds; else the first entry that breaks it (its id
    and 1-based position) and why."""

    count: int
    head: str
    entry_id: str | None = None
    position: int | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def line(self) -> str:
        if self.ok:
            return f"ok: {self.count} entries, head {self.head}"
        return f"entry {self.entry_id} (#{self.position}): {self.problem}"


def verify(entries: Iterable[Mapping[str, Any]]) -> Verdict:
    """Check a whole log, oldest first: every ``prev_hash`` links to the hash before it and
    every ``hash`` is the recomputed one."""
    head = GENESIS
    n = 0
    for n, entry in enumerate(entries, start=1):
        entry_id = str(entry.get("id"))
        if entry.get("prev_hash") != head:
            return Verdict(n, head, entry_id, n, "prev_hash does not link")
        if chain_hash(entry) != entry.get("hash"):
            return Verdict(n, head, entry_id, n, "hash mismatch")
        head = str(entry["hash"])
    return Verdict(n, head)
