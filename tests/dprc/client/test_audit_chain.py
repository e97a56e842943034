"""The client's own recomputation of the audit chain (``dprc audit verify``), on made-up
entries hashed here from the spec with hashlib: a changed, removed, inserted or reordered entry
is named."""

from __future__ import annotations

import hashlib
import json

from dprc.client.audit_chain import GENESIS, verify


def _chain(n: int) -> list[dict]:
    out, prev = [], GENESIS
    for i in range(n):
        e = {
            "id": f"audit-{i}",
            "created_at": 1_700_000_000 + i,
            "key_id": None if i == 0 else "key-a",
            "role": "shell" if i == 0 else "admin",
            "action": "key.create",
            "resource": f"key-{i}",
            "request_id": None if i == 0 else f"req-{i}",
            "detail": {"role": "viewer", "name": "Zoë", "n": i, "eps": 0.5},
            "prev_hash": prev,
        }
        payload = [e[k] for k in ("prev_hash", "id", "created_at", "key_id", "role", "action")]
        payload += [e["resource"], e["request_id"], e["detail"]]
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        e["hash"] = prev = hashlib.sha256(text.encode()).hexdigest()
        out.append(e)
    return out


def test_an_intact_chain_and_an_empty_one_are_ok():
    entries = _chain(4)
    assert verify(entries).line() == f"ok: 4 entries, head {entries[-1]['hash']}"
    assert verify([]).line() == f"ok: 0 entries, head {GENESIS}"


def test_the_first_broken_entry_is_named():
    changed = _chain(4)
    changed[2]["detail"]["role"] = "admin"
    assert verify(changed).line() == "entry audit-2 (#3): hash mismatch"

    removed = _chain(4)
    del removed[1]
    assert verify(removed).line() == "entry audit-2 (#2): prev_hash does not link"

    swapped = _chain(4)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    assert verify(swapped).line() == "entry audit-2 (#2): prev_hash does not link"

    relinked = _chain(3)  # a rewritten prev_hash (with its hash left as it was)
    relinked[0]["prev_hash"] = "f" * 64
    assert verify(relinked).line() == "entry audit-0 (#1): prev_hash does not link"

    head_only = _chain(3)
    head_only[2]["hash"] = "0" * 64
    verdict = verify(head_only)
    assert not verdict.ok and verdict.line() == "entry audit-2 (#3): hash mismatch"
