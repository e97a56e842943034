"""``/v1/organization/api_keys``: a tenant's admins create, list and revoke its keys; nobody
else may, and a refusal changes nothing; the last active admin key cannot be revoked."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

KEYS = "/v1/organization/api_keys"
AUDIT = "/v1/organization/audit_logs"


def _tenant() -> str:
    return f"org-{uuid.uuid4().hex[:10]}"


def _error(r, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()["error"]


def _ids(http) -> list[str]:
    r = http.get(KEYS, params={"limit": 100})
    assert r.status_code == 200, r.text
    return [k["id"] for k in r.json()["data"]]


def _state(admin) -> tuple[list, list]:
    """The tenant's keys and audit log as its admin sees them."""
    keys = admin.get(KEYS, params={"limit": 100}).json()["data"]
    log = admin.get(AUDIT, params={"limit": 1000}).json()["data"]
    return keys, log


def test_admin_creates_lists_and_revokes_keys(server):
    admin = server.http(server.key(_tenant()))
    me = admin.get("/v1/me").json()
    assert me["role"] == "admin"

    r = admin.post(KEYS, json={"role": "trainer", "name": "ci runner"})
    assert r.status_code == 200, r.text
    trainer = r.json()
    assert trainer["object"] == "organization.api_key"
    assert trainer["role"] == "trainer" and trainer["name"] == "ci runner"
    assert trainer["created_by"] == me["key_id"]
    assert trainer["revoked_at"] is None and trainer["revoked_by"] is None
    assert trainer["key"].startswith("dprc-") and trainer["key"].startswith(trainer["prefix"])
    viewer = admin.post(KEYS, json={"role": "viewer"}).json()
    default = admin.post(KEYS, json={}).json()
    assert viewer["role"] == "viewer" and viewer["name"] is None
    assert default["role"] == "trainer"

    # the secrets work and carry their roles
    with server.http(trainer["key"]) as h:
        assert h.get("/v1/me").json() == {
            "object": "api_key",
            "key_id": trainer["id"],
            "tenant": me["tenant"],
            "role": "trainer",
            "storage": me["storage"],  # the tenant's (GET /v1/me shows its storage use)
        }
    with server.http(viewer["key"]) as h:
        assert h.get("/v1/me").json()["role"] == "viewer"

    # the listing: oldest first, never a secret, pages by cursor
    listing = admin.get(KEYS)
    body = listing.json()
    assert body["object"] == "list" and body["has_more"] is False
    ids = [k["id"] for k in body["data"]]
    assert set(ids) == {me["key_id"], trainer["id"], viewer["id"], default["id"]}
    # oldest first (keys have no sequence number: ties of a second are in id order)
    assert [(k["created_at"], k["id"]) for k in body["data"]] == sorted(
        (k["created_at"], k["id"]) for k in body["data"]
    )
    assert body["first_id"] == ids[0] and body["last_id"] == ids[-1]
    assert all("key" not in k for k in body["data"])
    for secret in (trainer["key"], viewer["key"], default["key"]):
        assert secret not in listing.text
    first = admin.get(KEYS, params={"limit": 2}).json()
    assert [k["id"] for k in first["data"]] == ids[:2] and first["has_more"] is True
    rest = admin.get(KEYS, params={"limit": 2, "after": first["last_id"]}).json()
    assert [k["id"] for k in rest["data"]] == ids[2:] and rest["has_more"] is False
    assert _error(admin.get(KEYS, params={"after": "key-nope"}), 404)["param"] == "after"

    # refused bodies: 400 naming the field
    err = _error(admin.post(KEYS, json={"role": "viewer", "colour": "red"}), 400)
    assert err["param"] == "colour" and "colour" in err["message"]
    assert _error(admin.post(KEYS, json={"role": "root"}), 400)["param"] == "role"
    assert _error(admin.post(KEYS, json={"name": "x" * 129}), 400)["param"] == "name"
    assert _error(admin.post(KEYS, json={"name": "a\x00b"}), 400)["param"] == "name"
    assert _ids(admin) == ids

    # revoke: the key stops working at once and is listed as revoked, by whom
    r = admin.delete(f"{KEYS}/{default['id']}")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "object": "organization.api_key.deleted",
        "id": default["id"],
        "deleted": True,
    }
    with server.http(default["key"]) as h:
        assert _error(h.get("/v1/me"), 401)["code"] == "invalid_api_key"
    gone = {k["id"]: k for k in admin.get(KEYS).json()["data"]}[default["id"]]
    assert gone["revoked_at"] is not None and gone["revoked_by"] == me["key_id"]
    assert admin.delete(f"{KEYS}/{default['id']}").status_code == 200  # again: no change
    admin.close()


def test_trainers_and_viewers_may_not_manage_keys_or_read_the_log(server):
    admin = server.http(server.key(_tenant()))
    trainer = admin.post(KEYS, json={"role": "trainer"}).json()
    viewer = admin.post(KEYS, json={"role": "viewer"}).json()
    before = _state(admin)
    for secret in (trainer["key"], viewer["key"]):
        with server.http(secret) as h:
            for r in (
                h.post(KEYS, json={"role": "admin"}),
                h.post(KEYS, json={}),
                h.delete(f"{KEYS}/{trainer['id']}"),
                h.delete(f"{KEYS}/{viewer['id']}"),
                h.get(KEYS),
                h.get(AUDIT),
            ):
                err = _error(r, 403)
                assert err["code"] == "permission_denied" and err["type"] == "permission_error"
            assert h.get("/v1/me").status_code == 200  # still valid
    assert _state(admin) == before  # nothing changed, nothing was recorded
    admin.close()


def test_another_tenants_key_is_not_found(server):
    a = server.http(server.key(_tenant()))
    b = server.http(server.key(_tenant()))
    a_trainer = a.post(KEYS, json={}).json()
    before = _state(b)
    for key_id in (a_trainer["id"], "key-000000000000000000000000"):
        err = _error(b.delete(f"{KEYS}/{key_id}"), 404)
        assert err["param"] == "key_id"
    assert a_trainer["id"] not in _ids(b)
    assert _state(b) == before
    with server.http(a_trainer["key"]) as h:
        assert h.get("/v1/me").status_code == 200  # untouched
    a.close()
    b.close()


def test_the_last_admin_key_cannot_be_revoked(server):
    first_key = server.key(_tenant())
    first = server.http(first_key)
    first_id = first.get("/v1/me").json()["key_id"]
    err = _error(first.delete(f"{KEYS}/{first_id}"), 409)
    assert err["code"] == "last_admin" and first.get("/v1/me").status_code == 200

    second = first.post(KEYS, json={"role": "admin", "name": "second"}).json()
    r = first.delete(f"{KEYS}/{first_id}")  # an admin may revoke itself when another remains
    assert r.status_code == 200, r.text
    assert _error(first.get("/v1/me"), 401)["code"] == "invalid_api_key"
    with server.http(second["key"]) as h:
        assert _error(h.delete(f"{KEYS}/{second['id']}"), 409)["code"] == "last_admin"
        trainer = h.post(KEYS).json()  # no body: a trainer; not an admin, so revoking is fine
        assert trainer["role"] == "trainer"
        assert h.delete(f"{KEYS}/{trainer['id']}").status_code == 200
        assert h.get("/v1/me").json()["role"] == "admin"
    first.close()


def _revoke_together(server, secret: str, target: str, barrier: threading.Barrier) -> int:
    with server.http(secret) as h:
        barrier.wait()
        return h.delete(f"{KEYS}/{target}").status_code


def test_two_admins_revoking_each_other_at_once_leave_one(server):
    """Revocations of a tenant are serialized: whatever the interleaving, one admin stays."""
    for _ in range(3):
        first = server.key(_tenant())
        with server.http(first) as h:
            second = h.post(KEYS, json={"role": "admin"}).json()
            first_id = h.get("/v1/me").json()["key_id"]
        barrier = threading.Barrier(2)
        pairs = [(first, second["id"], barrier), (second["key"], first_id, barrier)]
        with ThreadPoolExecutor(2) as pool:
            codes = sorted(pool.map(lambda p: _revoke_together(server, *p), pairs))
        assert codes in ([200, 401], [200, 409]), codes
        alive = []
        for secret in (first, second["key"]):
            with server.http(secret) as h:
                alive.append(h.get("/v1/me").status_code == 200)
        assert alive.count(True) == 1, alive
