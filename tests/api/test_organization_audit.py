"""``/v1/organization/audit_logs``: key creations and revocations are recorded with the acting
key, its role and the request's id, chained by SHA-256 (recomputed here with hashlib from the
spec in docs/governance.md, not with the service's code); the shell's acts too. Admins only."""

from __future__ import annotations

import hashlib
import json
import uuid

KEYS = "/v1/organization/api_keys"
AUDIT = "/v1/organization/audit_logs"
GENESIS = "0" * 64


def spec_hash(e: dict) -> str:
    fields = ["prev_hash", "id", "created_at", "key_id", "role", "action", "resource"]
    payload = [e[f] for f in fields] + [e["request_id"], e["detail"]]
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def assert_chain(entries: list[dict]) -> None:
    prev = GENESIS
    for e in entries:
        assert e["prev_hash"] == prev, e
        assert spec_hash(e) == e["hash"], e
        prev = e["hash"]


def test_key_acts_are_recorded_and_chained(server):
    tenant = f"audit-{uuid.uuid4().hex[:10]}"
    admin = server.http(server.key(tenant))  # the shell's act: the log's first entry
    admin_id = admin.get("/v1/me").json()["key_id"]
    rid = f"req-test-{uuid.uuid4().hex[:8]}"
    r = admin.post(
        KEYS, json={"role": "viewer", "name": "Zoë's laptop"}, headers={"X-Request-ID": rid}
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == rid
    viewer = r.json()
    r = admin.delete(f"{KEYS}/{viewer['id']}", headers={"X-Request-ID": rid + "-2"})
    assert r.status_code == 200, r.text
    assert admin.delete(f"{KEYS}/{viewer['id']}").status_code == 200  # no change: no entry

    r = admin.get(AUDIT)
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["object"] == "list" and page["has_more"] is False
    shell, create, revoke = page["data"]
    assert page["first_id"] == shell["id"] and page["last_id"] == revoke["id"]
    assert all(e["object"] == "organization.audit_log" for e in page["data"])
    assert (shell["action"], shell["key_id"], shell["role"], shell["resource"]) == (
        "key.create",
        None,
        "shell",
        admin_id,
    )
    assert shell["detail"] == {"role": "admin", "name": None} and shell["request_id"] is None
    assert create["action"] == "key.create" and create["resource"] == viewer["id"]
    assert (create["key_id"], create["role"], create["request_id"]) == (admin_id, "admin", rid)
    assert create["detail"] == {"role": "viewer", "name": "Zoë's laptop"}
    assert revoke["action"] == "key.revoke" and revoke["resource"] == viewer["id"]
    assert (revoke["key_id"], revoke["request_id"]) == (admin_id, rid + "-2")
    assert revoke["detail"] == {"role": "viewer", "name": "Zoë's laptop"}
    assert shell["prev_hash"] == GENESIS
    assert create["prev_hash"] == shell["hash"] and revoke["prev_hash"] == create["hash"]
    assert_chain(page["data"])

    # filters and the cursor
    def ids(**params) -> list[str]:
        r = admin.get(AUDIT, params=params)
        assert r.status_code == 200, r.text
        return [e["id"] for e in r.json()["data"]]

    assert ids(action="key.revoke") == [revoke["id"]]
    assert ids(resource=viewer["id"]) == [create["id"], revoke["id"]]
    assert ids(key_id=admin_id) == [create["id"], revoke["id"]]
    assert ids(since=shell["created_at"]) == [shell["id"], create["id"], revoke["id"]]
    assert ids(until=shell["created_at"]) == []
    assert ids(limit=1, after=shell["id"]) == [create["id"]]
    one = admin.get(AUDIT, params={"limit": 1}).json()
    assert one["has_more"] is True and one["last_id"] == shell["id"]
    assert admin.get(AUDIT, params={"after": "audit-nope"}).status_code == 404
    assert admin.get(AUDIT, params={"limit": 1001}).status_code == 422

    # another tenant sees none of it
    with server.http(server.key(f"other-{uuid.uuid4().hex[:8]}")) as other:
        theirs = other.get(AUDIT).json()["data"]
        assert [e["role"] for e in theirs] == ["shell"] and theirs[0]["prev_hash"] == GENESIS
    admin.close()


def test_only_admins_read_the_audit_log(server):
    tenant = f"audit-{uuid.uuid4().hex[:10]}"
    admin = server.http(server.key(tenant))
    for role in ("trainer", "viewer"):
        with server.http(server.key(tenant, role)) as h:
            r = h.get(AUDIT)
            assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
    assert len(admin.get(AUDIT).json()["data"]) == 3  # the shell's three key creations
    admin.close()
