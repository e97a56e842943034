"""The Uploads API (issue 28): a data set uploaded in parts through the official ``openai``
client (``client.uploads``), over uvicorn, on PostgreSQL and SQLite — parts sent out of order
complete in the given order into an ordinary file a job trains on, ``upload_file_chunked``
(no extra fields) gets the tenant's default budget, a missing, unknown or repeated part and an
MD5 mismatch are 400 and leave the upload pending, cancel and expiry delete the parts and free
the reserved bytes, the storage quota counts pending uploads, another tenant gets 404."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import openai
import pytest
from sqlalchemy import select

from service.store.tables import Upload
from tests.api.conftest import (
    Server,
    _serve,
    _settings,
    exact_job_body,
    jsonl,
    labelled_lines,
    serving,
    text_lines,
)

GiB = 1024**3
DEFAULT_EPSILON = 8.0


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def srv(request, tmp_path_factory) -> Iterator[Server]:
    """A server whose tenants have a default budget (``upload_file_chunked`` sends no extra
    fields) and the default upload limits (8 GiB an upload, 20 GiB a tenant)."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    tmp = tmp_path_factory.mktemp(f"dprc-uploads-{request.param}")
    yield from _serve(_settings(tmp, url, default_epsilon_budget=DEFAULT_EPSILON))


@contextmanager
def server_with(request, tmp_path, backend: str, **settings: object) -> Iterator[Server]:
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    with serving(_settings(tmp_path, url, **settings)) as server:
        yield server


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def _create(client: openai.OpenAI, size: int, **extra) -> openai.types.Upload:
    return client.uploads.create(
        bytes=size,
        filename="train.jsonl",
        mime_type="text/jsonl",
        purpose="fine-tune",
        extra_body=extra or None,
    )


def _part(client: openai.OpenAI, upload_id: str, data: bytes) -> str:
    return client.uploads.parts.create(upload_id=upload_id, data=data).id


def _used(srv: Server, key: str) -> int:
    with srv.http(key) as http:
        return http.get("/v1/me").json()["storage"]["used_bytes"]


def _upload_dir(srv: Server, upload) -> list:
    return sorted(srv.settings.files_dir.rglob(f"*/uploads/{upload.id}"))


def _error(exc: openai.APIStatusError) -> dict:
    return exc.response.json()["error"]


def test_parts_out_of_order_complete_in_the_given_order(srv):
    key = srv.key("up-order")
    client = srv.client(key)
    data = labelled_lines(120)
    # cut inside lines: only the right order makes valid JSONL
    chunks = _chunks(data, [len(data) // 3 + 7, 2 * len(data) // 3 + 11])
    upload = _create(client, len(data), epsilon_budget=4)
    assert upload.status == "pending" and upload.object == "upload"
    assert upload.bytes == len(data) and upload.filename == "train.jsonl"
    assert upload.expires_at == upload.created_at + 3600
    assert upload.model_extra["epsilon_budget"] == 4
    ids = {i: None for i in range(3)}
    for i in (2, 0, 1):  # sent out of order
        part = client.uploads.parts.create(upload_id=upload.id, data=chunks[i])
        assert part.object == "upload.part" and part.upload_id == upload.id
        ids[i] = part.id
    # the parts in the wrong order are not a data set: 400, the upload stays pending
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.complete(upload_id=upload.id, part_ids=[ids[1], ids[0], ids[2]])
    assert _error(bad.value)["code"] == "invalid_jsonl"
    done = client.uploads.complete(
        upload_id=upload.id,
        part_ids=[ids[0], ids[1], ids[2]],
        md5=hashlib.md5(data).hexdigest(),
    )
    assert done.status == "completed" and done.file is not None
    file = done.file
    assert file.bytes == len(data) and file.filename == "train.jsonl"
    assert file.model_extra["n_examples"] == 120
    assert file.model_extra["budget"]["epsilon"] == 4
    assert file.model_extra["budget_default"] is False
    assert client.files.content(file.id).content == data
    assert client.files.retrieve(file.id).id == file.id
    assert not _upload_dir(srv, upload)  # the parts are gone
    assert _used(srv, key) == len(data)  # the file, the reservation no longer
    # an ordinary file: a job trains on it
    with srv.http(key) as http:
        job = http.post("/v1/fine_tuning/jobs", json=exact_job_body(file.id, 1.0))
        assert job.status_code == 200, job.text
        assert job.json()["status"] == "queued"
    # a completed upload takes no more parts, no second completion, no cancel
    with pytest.raises(openai.BadRequestError) as bad:
        _part(client, upload.id, b"more")
    assert _error(bad.value)["code"] == "upload_completed"
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.complete(upload_id=upload.id, part_ids=[ids[0], ids[1]])
    assert _error(bad.value)["code"] == "upload_completed"
    with pytest.raises(openai.BadRequestError):
        client.uploads.cancel(upload.id)
    # ... but the same completion again (a client's retry) answers the same file
    again = client.uploads.complete(upload_id=upload.id, part_ids=[ids[0], ids[1], ids[2]])
    assert again.status == "completed" and again.file.id == file.id
    with srv.http(key) as http:  # audited as a file upload, naming the upload
        entries = http.get(
            "/v1/organization/audit_logs", params={"action": "file.upload", "limit": 100}
        ).json()
    uploads = [e for e in entries["data"] if e["action"] == "file.upload"]
    assert any(e["detail"].get("upload_id") == upload.id for e in uploads), uploads


def test_a_retried_completion_waits_for_the_one_under_way(srv):
    """An HTTP client that times out on a long completion retries it: the retry waits for the
    completion under way and answers its file; another completion meanwhile is 409."""
    key = srv.key("up-retry")
    client = srv.client(key)
    data = text_lines(100_000)  # ~5 MB: a completion that lasts a moment
    upload = _create(client, len(data), epsilon_budget=3)
    half = len(data) // 2
    parts = [_part(client, upload.id, data[:half]), _part(client, upload.id, data[half:])]
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.uploads.complete, upload_id=upload.id, part_ids=parts)
        deadline = time.monotonic() + 60
        while True:  # the first completion is under way
            with srv.store.sessions() as session:
                state = session.execute(
                    select(Upload.status, Upload.completing_at).where(Upload.id == upload.id)
                ).one()
            if state.completing_at is not None or state.status != "pending":
                break
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert state.status == "pending", "the completion ended before it was seen"
        with pytest.raises(openai.ConflictError) as busy:  # another order is refused
            client.uploads.complete(upload_id=upload.id, part_ids=parts[::-1])
        assert _error(busy.value)["code"] == "upload_completing"
        retried = client.uploads.complete(upload_id=upload.id, part_ids=parts)
        done = first.result()
    assert done.status == retried.status == "completed"
    assert retried.file.id == done.file.id
    assert retried.file.model_extra["n_examples"] == 100_000


def test_upload_file_chunked_gets_the_tenants_default_budget(srv, tmp_path):
    key = srv.key("up-chunked")
    client = srv.client(key)
    path = tmp_path / "reviews.jsonl"
    data = text_lines(1500)  # more examples than one lookup chunk of budget_groups (500)
    path.write_bytes(data)
    done = client.uploads.upload_file_chunked(
        file=path, mime_type="text/jsonl", purpose="fine-tune", part_size=8000
    )
    assert done.status == "completed" and done.filename == "reviews.jsonl"
    assert done.file is not None and done.file.bytes == len(data)
    assert done.file.model_extra["budget"]["epsilon"] == DEFAULT_EPSILON
    assert done.file.model_extra["budget_default"] is True
    assert client.files.content(done.file.id).content == data
    # an upload of the same examples joins that data set's budget
    again = client.uploads.upload_file_chunked(
        file=data, filename="copy.jsonl", bytes=len(data), mime_type="text/jsonl",
        purpose="fine-tune", part_size=4096,
    )  # fmt: skip
    assert again.file is not None
    assert again.file.model_extra["budget_group"] == done.file.model_extra["budget_group"]
    assert again.file.model_extra["joined_budget_group"] is True
    assert again.file.model_extra["n_examples"] == 1500


def test_a_missing_unknown_or_repeated_part_is_400(srv):
    key = srv.key("up-parts")
    client = srv.client(key)
    data = text_lines(40)
    first, second = _chunks(data, [len(data) // 2])
    upload = _create(client, len(data))
    a, b = _part(client, upload.id, first), _part(client, upload.id, second)
    other = _create(client, 10)
    foreign = _part(client, other.id, b"0123456789")

    cases = [
        ([a], "upload_bytes_mismatch", b),  # b missing: the parts do not add up, b named
        ([a, b, "part-0000"], "upload_part_not_found", "part-0000"),
        ([a, foreign], "upload_part_not_found", foreign),  # another upload's part
        ([a, b, a], "duplicate_part", a),
        ([], "upload_bytes_mismatch", None),
    ]
    for part_ids, code, named in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.uploads.complete(upload_id=upload.id, part_ids=part_ids)
        err = _error(bad.value)
        assert err["code"] == code and err["param"] == "part_ids", (part_ids, err)
        if named:
            assert named in err["message"], err
    with pytest.raises(openai.NotFoundError) as missing:
        client.uploads.complete(upload_id="upload-nosuch", part_ids=[a])
    assert _error(missing.value)["code"] == "upload_not_found"
    # refused completions left it pending: the right list completes it
    done = client.uploads.complete(upload_id=upload.id, part_ids=[a, b])
    assert done.status == "completed" and client.files.content(done.file.id).content == data
    # a part beyond the announced bytes is refused
    with pytest.raises(openai.BadRequestError) as bad:
        _part(client, other.id, b"x")
    assert _error(bad.value)["code"] == "upload_bytes_exceeded"
    # a part whose bytes left the data folder (a restored database): 400, not a crash
    (folder,) = _upload_dir(srv, other)
    (folder / f"{foreign}.part").unlink()
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.complete(upload_id=other.id, part_ids=[foreign])
    assert _error(bad.value)["code"] == "upload_part_gone"
    client.uploads.cancel(other.id)
    assert not folder.exists()


def test_parts_sent_in_parallel(srv):
    client = srv.client(srv.key("up-parallel"))
    data = text_lines(400)
    chunks = _chunks(data, [i * len(data) // 8 + 3 for i in range(1, 8)])
    upload = _create(client, len(data), epsilon_budget=5)
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda c: _part(client, upload.id, c), chunks))
    done = client.uploads.complete(upload_id=upload.id, part_ids=ids)
    assert client.files.content(done.file.id).content == data
    assert done.file.model_extra["n_examples"] == 400


def test_an_md5_mismatch_is_400_and_the_right_md5_completes(srv):
    client = srv.client(srv.key("up-md5"))
    data = labelled_lines(30)
    upload = _create(client, len(data), epsilon_budget=2, delta=1e-3)
    part = _part(client, upload.id, data)
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.complete(
            upload_id=upload.id, part_ids=[part], md5=hashlib.md5(b"other").hexdigest()
        )
    err = _error(bad.value)
    assert err["code"] == "md5_mismatch" and err["param"] == "md5"
    assert hashlib.md5(data).hexdigest() in err["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.complete(upload_id=upload.id, part_ids=[part], md5="not-hex")
    assert _error(bad.value)["param"] == "md5"
    done = client.uploads.complete(
        upload_id=upload.id, part_ids=[part], md5=hashlib.md5(data).hexdigest().upper()
    )
    assert done.status == "completed"
    assert done.file.model_extra["budget"]["epsilon"] == 2
    assert done.file.model_extra["budget"]["delta"] == 1e-3


def test_cancel_deletes_the_parts_and_frees_the_space(srv):
    key = srv.key("up-cancel")
    client = srv.client(key)
    before = _used(srv, key)
    upload = _create(client, 5000)
    assert _used(srv, key) == before + 5000  # reserved at creation
    _part(client, upload.id, b"x" * 3000)
    (folder,) = _upload_dir(srv, upload)
    assert sum(p.stat().st_size for p in folder.iterdir()) == 3000
    cancelled = client.uploads.cancel(upload.id)
    assert cancelled.status == "cancelled" and cancelled.file is None
    assert not folder.exists()
    assert _used(srv, key) == before
    with pytest.raises(openai.BadRequestError) as bad:
        _part(client, upload.id, b"y")
    assert _error(bad.value)["code"] == "upload_cancelled"
    assert not folder.exists()
    with pytest.raises(openai.BadRequestError):
        client.uploads.complete(upload_id=upload.id, part_ids=[])
    assert client.uploads.cancel(upload.id).status == "cancelled"  # again: as it is


def test_the_storage_quota_counts_pending_uploads(srv):
    """20 GiB a tenant, 8 GiB an upload: two announced uploads reserve 16 GiB, a third is 413
    until one is cancelled; the reservations count for one-shot file uploads too."""
    key = srv.key("up-quota")
    client = srv.client(key)
    one, two = _create(client, 8 * GiB), _create(client, 8 * GiB)
    assert _used(srv, key) == 16 * GiB
    with pytest.raises(openai.APIStatusError) as refused:
        _create(client, 8 * GiB)
    assert refused.value.status_code == 413
    err = _error(refused.value)
    assert err["code"] == "storage_quota_exceeded" and err["param"] == "bytes", err
    with pytest.raises(openai.APIStatusError) as too_big:
        _create(client, 8 * GiB + 1)
    assert too_big.value.status_code == 413 and _error(too_big.value)["param"] == "bytes"
    nearly = _create(client, srv.settings.tenant_storage_bytes - 16 * GiB - 100)
    with pytest.raises(openai.APIStatusError) as full:  # a one-shot upload no longer fits
        client.files.create(file=("f.jsonl", text_lines(10)), purpose="fine-tune")
    assert _error(full.value)["code"] == "storage_quota_exceeded"
    client.uploads.cancel(nearly.id)
    client.uploads.cancel(one.id)
    third = _create(client, 8 * GiB)
    assert _used(srv, key) == 16 * GiB
    client.files.create(file=("f.jsonl", text_lines(10)), purpose="fine-tune")
    for upload in (two, third):
        client.uploads.cancel(upload.id)


def test_another_tenant_gets_404_and_roles_apply(srv):
    owner = srv.client(srv.key("up-owner"))
    data = text_lines(10)
    upload = _create(owner, len(data))
    part = _part(owner, upload.id, data)
    stranger = srv.client(srv.key("up-stranger"))
    for act in (
        lambda: _part(stranger, upload.id, b"x"),
        lambda: stranger.uploads.complete(upload_id=upload.id, part_ids=[part]),
        lambda: stranger.uploads.cancel(upload.id),
    ):
        with pytest.raises(openai.NotFoundError) as nf:
            act()
        assert _error(nf.value)["code"] == "upload_not_found"
    viewer = srv.client(srv.key("up-owner", role="viewer"))
    with pytest.raises(openai.PermissionDeniedError):
        _create(viewer, 10)
    with pytest.raises(openai.PermissionDeniedError):
        viewer.uploads.complete(upload_id=upload.id, part_ids=[part])
    trainer = srv.client(srv.key("up-owner", role="trainer"))
    assert trainer.uploads.complete(upload_id=upload.id, part_ids=[part]).status == "completed"


def test_strict_fields(srv):
    key = srv.key("up-strict")
    client = srv.client(key)
    for extra, param in [
        ({"epsilon": 4}, "epsilon"),  # unknown field
        ({"epsilon_budget": "4"}, "epsilon_budget"),  # a string, not a number
        ({"epsilon_budget": 0}, "epsilon_budget"),
        ({"epsilon_budget": 101}, "epsilon_budget"),
        ({"delta": 1}, "delta"),
        ({"unbudgeted": "true"}, "unbudgeted"),
        ({"expires_after": {"anchor": "created_at", "seconds": 3600}}, "expires_after"),
    ]:
        with pytest.raises(openai.BadRequestError) as bad:
            _create(client, 100, **extra)
        assert _error(bad.value)["param"] == param, (extra, _error(bad.value))
    with srv.http(key) as http:
        body = {"bytes": 100, "filename": "a.jsonl", "mime_type": "text/jsonl"}
        for change, param in [
            ({"purpose": "assistants"}, "purpose"),
            ({"purpose": "fine-tune", "bytes": 0}, "bytes"),
            ({"purpose": "fine-tune", "bytes": "100"}, "bytes"),
            ({"purpose": "fine-tune", "mime_type": "jsonl"}, "mime_type"),
            ({}, "purpose"),  # missing
        ]:
            r = http.post("/v1/uploads", json={**body, **change})
            assert r.status_code == 400, (change, r.text)
            assert r.json()["error"]["param"] == param, (change, r.text)
        upload = http.post("/v1/uploads", json={**body, "purpose": "fine-tune"}).json()
        r = http.post(
            f"/v1/uploads/{upload['id']}/parts",
            files={"data": ("p", b"x" * 10)},
            data={"index": "1"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "index", r.text
        r = http.post(f"/v1/uploads/{upload['id']}/complete", json={"part_ids": [], "x": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x", r.text
        assert http.post(f"/v1/uploads/{upload['id']}/cancel").status_code == 200
    # the budget is placed at completion, with the rules of a file upload: unbudgeted=true
    # with a budget is refused there, and the upload stays pending
    data = jsonl([{"text": "a"}, {"text": "b"}])
    both = _create(client, len(data), unbudgeted=True, epsilon_budget=3)
    assert both.model_extra["unbudgeted"] is True
    part = _part(client, both.id, data)
    with pytest.raises(openai.BadRequestError) as bad:
        client.uploads.complete(upload_id=both.id, part_ids=[part])
    assert _error(bad.value)["param"] == "unbudgeted"
    assert client.uploads.cancel(both.id).status == "cancelled"
    plain = _create(client, len(data), unbudgeted=True)
    done = client.uploads.complete(upload_id=plain.id, part_ids=[_part(client, plain.id, data)])
    assert done.file.model_extra["unbudgeted"] is True and done.file.model_extra["budget"] is None


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_expiry_frees_the_space(backend, request, tmp_path):
    # expiry in whole seconds: an upload of 3 s lives 2 to 3 s
    with server_with(request, tmp_path, backend, upload_expiry_seconds=3) as srv:
        key = srv.key(f"up-expiry-{backend}")
        client = srv.client(key)
        upload = _create(client, 4000)
        _part(client, upload.id, b"z" * 3000)
        (folder,) = _upload_dir(srv, upload)
        assert _used(srv, key) == 4000
        deadline = time.monotonic() + 30
        while _used(srv, key) != 0 or folder.exists():  # the API's sweep, every 3 s
            assert time.monotonic() < deadline, "the expired upload was not swept"
            time.sleep(0.2)
        with pytest.raises(openai.BadRequestError) as bad:
            _part(client, upload.id, b"z")
        assert _error(bad.value)["code"] == "upload_expired"
        with pytest.raises(openai.BadRequestError) as bad:
            client.uploads.complete(upload_id=upload.id, part_ids=[])
        assert _error(bad.value)["code"] == "upload_expired"
        assert client.uploads.cancel(upload.id).status == "expired"
        assert not folder.exists()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_part_and_line_limits(backend, request, tmp_path):
    limits = {"max_upload_part_bytes": 4096, "upload_max_line_bytes": 200}
    with server_with(request, tmp_path, backend, **limits) as srv:
        key = srv.key(f"up-limits-{backend}")
        client = srv.client(key)
        # a part above DPRC_MAX_UPLOAD_PART_BYTES (4096) is 413, from the body limit too
        big = _create(client, 3 * GiB)
        with pytest.raises(openai.APIStatusError) as too_big:
            _part(client, big.id, b"x" * 5000)
        assert too_big.value.status_code == 413
        assert _error(too_big.value) | {"message": ""} == {
            "message": "",
            "type": "invalid_request_error",
            "param": "data",
            "code": "file_too_large",
        }
        with srv.http(key) as http:
            r = http.post(f"/v1/uploads/{big.id}/parts", files={"data": ("p", b"x" * (2 << 20))})
            assert r.status_code == 413 and r.json()["error"]["param"] == "data", r.text
        assert not any(_upload_dir(srv, big)[0].iterdir())  # nothing left of them
        client.uploads.cancel(big.id)

        # a line above DPRC_UPLOAD_MAX_LINE_BYTES (200) is a bad line, named
        data = jsonl([{"text": "short"}, {"text": "long " * 60}, {"text": "short"}])
        lined = _create(client, len(data), epsilon_budget=1)
        part = _part(client, lined.id, data)
        with pytest.raises(openai.BadRequestError) as bad:
            client.uploads.complete(upload_id=lined.id, part_ids=[part])
        err = _error(bad.value)
        assert err["code"] == "invalid_jsonl" and "line 2: longer than 200 bytes" in err["message"]
        assert client.uploads.cancel(lined.id).status == "cancelled"


def test_one_shot_files_are_unchanged(srv):
    """``POST /v1/files`` keeps its limit (DPRC_MAX_UPLOAD_BYTES) and its answers."""
    client = srv.client(srv.key("up-oneshot"))
    data = labelled_lines(50)
    f = client.files.create(
        file=("d.jsonl", data), purpose="fine-tune", extra_body={"epsilon_budget": "3"}
    )
    assert f.model_extra["n_examples"] == 50 and f.model_extra["budget"]["epsilon"] == 3
    with pytest.raises(openai.APIStatusError) as big:
        client.files.create(
            file=("b.jsonl", b"x" * (srv.settings.max_upload_bytes + 1)), purpose="fine-tune"
        )
    assert big.value.status_code == 413
