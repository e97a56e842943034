"""Per-tenant storage quota (issue 16 item 6): concurrent uploads through HTTP never take a
tenant beyond its quota, the ones that do not fit are 413 ``storage_quota_exceeded`` and leave
nothing on disk, deleting makes room, another tenant is not affected."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import httpx
import pytest

from tests.api.conftest import _serve, _settings, jsonl


def _body(i: int, size: int) -> bytes:
    line = {"text": f"upload {i} "}
    pad = size - len(jsonl([line, line]))
    return jsonl([{"text": line["text"] + "x" * pad}, line])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_uploads_stay_within_the_quota(backend, request, tmp_path):
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    size, fits, clients = 2000, 5, 16
    quota = fits * size + size // 2  # room for 5 uploads and a half
    settings = _settings(tmp_path, url).model_copy(update={"tenant_storage_bytes": quota})
    with contextmanager(_serve)(settings) as srv:
        key = srv.key(f"quota-{backend}")
        barrier = threading.Barrier(clients)
        results: list[httpx.Response] = []
        lock = threading.Lock()

        def upload(i: int) -> None:
            with srv.http(key) as http:
                barrier.wait()
                r = http.post(
                    "/v1/files",
                    files={"file": (f"{i}.jsonl", _body(i, size))},
                    data={"purpose": "fine-tune"},
                )
            with lock:
                results.append(r)

        threads = [threading.Thread(target=upload, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = [r for r in results if r.status_code == 200]
        refused = [r for r in results if r.status_code == 413]
        assert len(ok) == fits and len(refused) == clients - fits, [r.text for r in results]
        for r in refused:
            err = r.json()["error"]
            assert err["code"] == "storage_quota_exceeded" and err["param"] == "file", err
            assert str(quota) in err["message"]
        assert all(r.json()["bytes"] == size for r in ok)
        tenant_dir = {p for p in srv.settings.files_dir.rglob("*.jsonl")}
        assert len(tenant_dir) == fits  # the refused uploads left nothing on disk
        with srv.http(key) as http:
            listed = http.get("/v1/files").json()["data"]
            assert sum(f["bytes"] for f in listed) == fits * size <= quota
            one_more = {"file": ("m.jsonl", _body(99, size))}
            r = http.post("/v1/files", files=one_more, data={"purpose": "fine-tune"})
            assert r.status_code == 413
            assert http.delete(f"/v1/files/{listed[0]['id']}").status_code == 200
            r = http.post("/v1/files", files=one_more, data={"purpose": "fine-tune"})
            assert r.status_code == 200, r.text
        with srv.http(srv.key(f"quota-other-{backend}")) as http:
            r = http.post(
                "/v1/files",
                files={"file": ("o.jsonl", _body(0, size))},
                data={"purpose": "fine-tune"},
            )
            assert r.status_code == 200, r.text
