"""Dashboard sessions kept by the server (service/governance/dashboard_sessions.py), over real
uvicorn on
PostgreSQL and SQLite: signing in by the form opens a session whose cookie works on the JSON
API and the pages; signing out ends it on the server (the old cookie is then refused), a
revoked key or an expired session too; both acts are in the audit chain. Any malformed cookie
(the old format's crafted ones included, sent raw) is a clean 401 ``invalid_session`` on the
API and a redirect on the pages, with nothing logged as an error. The cookie is Secure behind
an https public URL, through a trusted proxy that says https, and over https itself — and not
when an untrusted client sends ``X-Forwarded-Proto`` itself."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update

from api.dashboard.session import COOKIE
from service.governance.audit import Act, entry_hash
from service.governance.keys import revoke_key
from service.store.tables import AuditEntry, DashboardSession, Tenant
from tests.api.conftest import Server, _serve, _settings

V2 = re.compile(r"v2\.[A-Za-z0-9_-]{43}")


def _tenant() -> str:
    return f"sessions-{uuid.uuid4().hex[:10]}"


def _sign_in(srv: Server, key: str) -> tuple[httpx.Client, httpx.Response]:
    http = httpx.Client(base_url=srv.base_url, timeout=60)
    r = http.post("/sign-in", data={"api_key": key})
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    return http, r


def _raw(srv: Server, path: str, cookie: str | bytes, method: str = "GET") -> httpx.Response:
    """``path`` with exactly this Cookie header (bytes as they are: non-ASCII too), no key."""
    value = cookie if isinstance(cookie, bytes) else cookie.encode("utf-8")
    with httpx.Client(base_url=srv.base_url, timeout=60, verify=False) as http:
        return http.request(method, path, headers=[(b"cookie", b"dprc_session=" + value)])


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.json()["error"]["code"] == "invalid_session", r.text


def _to_sign_in(r: httpx.Response) -> None:
    assert r.status_code == 303 and r.headers["location"] == "/sign-in", (r.status_code, r.text)


class Records(logging.Handler):
    """Every record of the app's and uvicorn's loggers (uvicorn's do not reach the root)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        return [
            f"{r.name}: {r.getMessage()}"
            for r in self.records
            if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()
        ]


@pytest.fixture
def server_log() -> Iterator[Records]:
    handler = Records()
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _audit(srv: Server, tenant: str) -> list[AuditEntry]:
    """The tenant's session entries in chain order (the keys' creation on the shell is
    audited too: left out)."""
    with srv.store.sessions() as session:
        tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == tenant))
        return list(
            session.scalars(
                select(AuditEntry)
                .where(AuditEntry.tenant_id == tenant_id, AuditEntry.action.like("session.%"))
                .order_by(AuditEntry.seq)
            )
        )


def test_sign_in_opens_a_session_and_sign_out_ends_it(server):
    tenant = _tenant()
    key = server.key(tenant, "trainer")
    http, r = _sign_in(server, key)
    header = r.headers["set-cookie"]
    assert "HttpOnly" in header and "SameSite=strict" in header and "Path=/" in header
    assert "Max-Age=43200" in header and "secure" not in header.lower()  # plain http
    value = http.cookies[COOKIE]
    assert V2.fullmatch(value) and key not in header
    token = value.removeprefix("v2.")
    # the cookie works on the JSON API and the pages, with no key
    me = http.get("/v1/me")
    assert me.status_code == 200 and me.json()["tenant"] == tenant
    key_id = me.json()["key_id"]
    assert http.get("/v1/files").status_code == 200
    page = http.get("/")
    assert page.status_code == 200 and 'data-role="trainer"' in page.text
    # only the token's SHA-256 is stored
    with server.store.sessions() as session:
        row = session.get(DashboardSession, hashlib.sha256(token.encode()).hexdigest())
        assert row is not None and row.key_id == key_id and row.ended_at is None
        assert row.expires_at - row.created_at == 12 * 3600
        assert (
            session.scalar(select(DashboardSession).where(DashboardSession.token_hash == token))
            is None
        )

    # sign-out ends the session on the server: the old cookie is refused everywhere
    out = http.post("/sign-out")
    _to_sign_in(out)
    assert (
        out.headers["set-cookie"].startswith(f'{COOKIE}=""')
        or "Max-Age=0" in (out.headers["set-cookie"])
    )
    _refused(_raw(server, "/v1/files", value))
    _refused(_raw(server, "/v1/me", value))
    _to_sign_in(_raw(server, "/jobs", value))
    with server.store.sessions() as session:
        row = session.get(DashboardSession, hashlib.sha256(token.encode()).hexdigest())
        assert row is not None and row.ended_at is not None
    # signing out twice writes nothing more
    _to_sign_in(_raw(server, "/sign-out", value, method="POST"))

    # sign-in and sign-out are in the tenant's audit chain, naming the key and the session
    entries = _audit(server, tenant)
    assert [(e.action, e.resource, e.key_id) for e in entries] == [
        (Act.SIGN_IN, key_id, key_id),
        (Act.SIGN_OUT, key_id, key_id),
    ]
    assert entries[0].detail == entries[1].detail
    assert entries[1].prev_hash == entries[0].hash
    assert all(e.role == "trainer" and e.request_id for e in entries)
    for e in entries:
        assert e.hash == entry_hash(
            e.prev_hash,
            e.id,
            e.created_at,
            e.key_id,
            e.role,
            e.action,
            e.resource,
            e.request_id,
            json.loads(e.detail),
        )
    # a second sign-in is a new session; the first stays ended
    again, _ = _sign_in(server, key)
    assert again.cookies[COOKIE] != value and again.get("/v1/files").status_code == 200
    _refused(_raw(server, "/v1/files", value))


def test_a_revoked_key_or_an_expired_session_is_refused(server):
    tenant = _tenant()
    http, _ = _sign_in(server, server.key(tenant, "viewer"))
    key_id = http.get("/v1/me").json()["key_id"]
    with server.store.sessions() as session:
        assert revoke_key(session, key_id)
    _refused(http.get("/v1/files"))
    _to_sign_in(http.get("/jobs"))

    other, _ = _sign_in(server, server.key(tenant, "viewer"))
    assert other.get("/v1/files").status_code == 200
    token = other.cookies[COOKIE].removeprefix("v2.")
    with server.store.sessions() as session:
        session.execute(
            update(DashboardSession)
            .where(DashboardSession.token_hash == hashlib.sha256(token.encode()).hexdigest())
            .values(expires_at=DashboardSession.created_at - 1)
        )
        session.commit()
    _refused(other.get("/v1/files"))
    _to_sign_in(other.get("/"))


def _crafted(key_id: str) -> list[bytes]:
    mac = "0" * 64
    expiry = "9999999999"
    token = "A" * 43
    values = [
        # the old format's crafted cookies (500s with a logged traceback before)
        f"v1.{key_id}.\u00b2.{mac}",
        f"v1.{key_id}.{expiry}.{'é' * 64}",
        f"v1.{key_id}.{'9' * 5000}.{mac}",
        f"v1.{key_id}.{expiry}.{mac}",
        # malformed new ones
        "",
        "v2",
        "v2.",
        "v2..",
        "..",
        "v3." + token,
        "V2." + token,
        "v2." + token[:-1],
        "v2." + token + "A",
        "v2." + token + ".",
        "v2." + token[:-1] + "\u00b2",
        "v2." + "\uff21" * 43,  # fullwidth A
        "v2." + token[:-1] + "=",
        "v2." + "9" * 5000,
        "v2." + token + "\u00e9",
        "x" * 8000,
        '"v2.' + token + '"',
        "v2.%41" + token[:-3],
    ]
    return (
        [v.encode("utf-8") for v in values]
        + [
            ("v2." + token[:-1]).encode() + b"\xff",  # not UTF-8 at all
            ("v2." + token[:-1]).encode() + b"\x80",
        ]
    )


def test_malformed_cookies_are_a_clean_401(server, server_log):
    tenant = _tenant()
    http, _ = _sign_in(server, server.key(tenant, "admin"))
    key_id = http.get("/v1/me").json()["key_id"]
    well_formed = "v2." + "A" * 43  # no such session
    _refused(_raw(server, "/v1/files", well_formed))
    for cookie in _crafted(key_id):
        for path in ("/v1/files", "/v1/me"):
            _refused(_raw(server, path, cookie))
        _refused(_raw(server, "/v1/fine_tuning/jobs", cookie, method="POST"))
        page = _raw(server, "/data-sets", cookie)
        _to_sign_in(page)
        assert f"{COOKIE}=" in page.headers.get("set-cookie", "")  # cleared
        _to_sign_in(_raw(server, "/sign-out", cookie, method="POST"))
    assert server_log.errors() == []
    # nothing signed in with any of them: the audit log holds the one sign-in
    assert [e.action for e in _audit(server, tenant)] == [Act.SIGN_IN]


# ------------------------------------------------------------------------------ Secure flag


@pytest.fixture(scope="module")
def public_https(tmp_path_factory) -> Iterator[Server]:
    settings = _settings(
        tmp_path_factory.mktemp("dprc-public-https"), None, public_url="https://dprc.example.org"
    )
    yield from _serve(settings)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory) -> Iterator[Server]:
    """Behind a trusted proxy at 127.0.0.1 (requests from 127.0.0.2 are from elsewhere)."""
    settings = _settings(
        tmp_path_factory.mktemp("dprc-proxied"), None, trusted_proxies=["127.0.0.1"]
    )
    yield from _serve(settings)


def _self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("dprc-tls")
    cert, key = _self_signed(tmp)
    yield from _serve(_settings(tmp / "data", None), ssl_certfile=str(cert), ssl_keyfile=str(key))


def _set_cookie(srv: Server, key: str, headers: dict[str, str] | None = None, **client) -> str:
    with httpx.Client(base_url=srv.base_url, timeout=60, verify=False, **client) as http:
        r = http.post("/sign-in", data={"api_key": key}, headers=headers or {})
        assert r.status_code == 303, r.text
        return r.headers["set-cookie"]


def _secure(header: str) -> bool:
    return "secure" in [p.strip().lower() for p in header.split(";")]


def test_secure_behind_an_https_public_url(public_https):
    header = _set_cookie(public_https, public_https.key(_tenant()))
    assert _secure(header) and "HttpOnly" in header


def test_secure_through_a_trusted_proxy_only(proxied, server):
    key = proxied.key(_tenant())
    https = {"X-Forwarded-Proto": "https"}
    assert _secure(_set_cookie(proxied, key, https))
    assert _secure(_set_cookie(proxied, key, {"X-Forwarded-Proto": "http, https"}))
    assert not _secure(_set_cookie(proxied, key))
    assert not _secure(_set_cookie(proxied, key, {"X-Forwarded-Proto": "http"}))
    # the same header from an address that is not a trusted proxy counts for nothing
    elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
    assert not _secure(_set_cookie(proxied, key, https, transport=elsewhere))
    # and where no proxy is trusted, not even from 127.0.0.1
    assert not _secure(_set_cookie(server, server.key(_tenant()), https))


def test_secure_over_https_itself(tls):
    key = tls.key(_tenant())
    assert tls.base_url.startswith("https://")
    header = _set_cookie(tls, key)
    assert _secure(header)
    # the session works over https (httpx sends a Secure cookie back over https only)
    with httpx.Client(base_url=tls.base_url, timeout=60, verify=False) as http:
        assert http.post("/sign-in", data={"api_key": key}).status_code == 303
        assert http.get("/v1/files").status_code == 200
