"""The Uploads API in-process (docs/api.md, "Uploads"; :mod:`service.data.uploads`): parts in any
order, assembled in the order the completion names; a completion whose parts do not hold the
announced bytes is refused and leaves the upload pending; a part beyond them is refused; a
cancelled or expired upload frees its reservation and its parts."""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path

import pytest

from service.base.errors import InvalidInput, TooLarge
from service.data import files, uploads
from service.data.budget_groups import BudgetWish
from tests.service.conftest import reviews


def _create(domain, caller, size: int, epsilon: float | None = 4.0):
    return uploads.create(
        domain.store,
        caller,
        size=size,
        filename="parts.jsonl",
        purpose="fine-tune",
        mime_type="text/jsonl",
        wish=BudgetWish(epsilon_budget=epsilon),
    )


def _parts(domain, caller, upload_id: str, chunks: list[bytes]) -> list[str]:
    return [uploads.add_part(domain.store, caller, upload_id, io.BytesIO(c)).id for c in chunks]


def _split(data: bytes, n: int) -> list[bytes]:
    cut = [len(data) * i // n for i in range(n + 1)]
    return [data[a:b] for a, b in zip(cut, cut[1:], strict=False)]


def _used(domain) -> int:
    return files.storage(domain.store, domain.acme.viewer).used_bytes


def test_completion_assembles_the_parts_in_the_named_order(domain):
    owner = domain.acme.owner
    data = reviews(40)
    a, b, c = _split(data, 3)
    upload = _create(domain, owner, len(data))
    assert _used(domain) == len(data)  # reserved at creation
    ids = dict(zip("cab", _parts(domain, owner, upload.row.id, [c, a, b]), strict=True))
    order = [ids["a"], ids["b"], ids["c"]]
    done = uploads.complete(
        domain.store, owner, upload.row.id, order, hashlib.md5(data).hexdigest()
    )
    assert done.row.status == "completed" and done.file is not None
    stored = done.file
    assert stored.row.n_examples == 40 and stored.row.bytes == len(data)
    assert stored.budget is not None and stored.budget.epsilon == 4.0
    path, _name = files.content_path(domain.store, owner, stored.row.id)
    assert path.read_bytes() == data
    assert not uploads.upload_dir(domain.store.settings, owner.tenant_id, upload.row.id).exists()
    assert _used(domain) == len(data)  # the file's bytes, no longer the reservation too
    (entry,) = domain.audit(domain.acme, "file.upload")
    assert entry.resource == stored.row.id
    # the same completion repeated (a client's retry) answers the same file
    again = uploads.complete(domain.store, owner, upload.row.id, order, None)
    assert again.file is not None and again.file.row.id == stored.row.id
    assert len(domain.audit(domain.acme, "file.upload")) == 1


def test_a_completion_that_does_not_fit_is_refused_and_the_upload_stays_pending(domain):
    owner = domain.acme.owner
    data = reviews(30)
    a, b = _split(data, 2)
    upload = _create(domain, owner, len(data))
    pa, pb = _parts(domain, owner, upload.row.id, [a, b])
    refusals = {
        "upload_bytes_mismatch": [pa],  # a part missing: fewer bytes than announced
        "duplicate_part": [pa, pa, pb],
        "upload_part_not_found": [pa, "part-nonexistent"],
    }
    for code, part_ids in refusals.items():
        with pytest.raises(InvalidInput) as refused:
            uploads.complete(domain.store, owner, upload.row.id, part_ids, None)
        assert (refused.value.code, refused.value.param) == (code, "part_ids")
    with pytest.raises(InvalidInput) as wrong_md5:
        uploads.complete(domain.store, owner, upload.row.id, [pa, pb], "0" * 32)
    assert wrong_md5.value.code == "md5_mismatch"
    with pytest.raises(InvalidInput):  # the wrong order: no longer JSONL
        uploads.complete(domain.store, owner, upload.row.id, [pb, pa], None)
    assert domain.audit(domain.acme, "file.upload") == []
    done = uploads.complete(domain.store, owner, upload.row.id, [pa, pb], None)  # still pending
    assert done.file is not None and done.file.row.n_examples == 30


def test_a_part_beyond_the_announced_bytes_is_refused(make_domain):
    domain = make_domain(max_upload_part_bytes=64)
    owner = domain.acme.owner
    upload = _create(domain, owner, 100)
    _parts(domain, owner, upload.row.id, [b"x" * 60])
    with pytest.raises(InvalidInput) as beyond:
        _parts(domain, owner, upload.row.id, [b"y" * 41])  # 101 > 100
    assert beyond.value.code == "upload_bytes_exceeded"
    with pytest.raises(TooLarge):  # beyond a part's limit
        _parts(domain, owner, upload.row.id, [b"z" * 65])
    with pytest.raises(TooLarge):  # beyond the upload's limit
        _create(domain, owner, domain.store.settings.max_upload_total_bytes + 1)
    folder = uploads.upload_dir(domain.store.settings, owner.tenant_id, upload.row.id)
    assert sorted(p.stat().st_size for p in folder.iterdir()) == [60]


def test_an_upload_beyond_the_storage_quota_is_refused(make_domain):
    domain = make_domain(tenant_storage_bytes=10_000)
    owner = domain.acme.owner
    _create(domain, owner, 6_000)
    with pytest.raises(TooLarge) as refused:
        _create(domain, owner, 5_000)  # 11,000 with the first one's reservation
    assert refused.value.code == "storage_quota_exceeded"
    with pytest.raises(TooLarge):  # a one-shot upload counts the reservation too
        domain.upload(owner, reviews(80), epsilon=1.0)
    assert len(reviews(80)) > 4_000


def test_a_cancelled_upload_frees_its_reservation_and_parts(domain):
    owner = domain.acme.owner
    upload = _create(domain, owner, 50)
    _parts(domain, owner, upload.row.id, [b"x" * 20])
    folder = uploads.upload_dir(domain.store.settings, owner.tenant_id, upload.row.id)
    assert folder.exists() and _used(domain) == 50
    assert uploads.cancel(domain.store, owner, upload.row.id).row.status == "cancelled"
    assert not folder.exists() and _used(domain) == 0
    with pytest.raises(InvalidInput) as closed:
        _parts(domain, owner, upload.row.id, [b"y"])
    assert closed.value.code == "upload_cancelled"


def test_an_upload_not_completed_in_time_expires(make_domain):
    # long enough for the create and the part under a loaded machine (1 s expired between them)
    domain = make_domain(upload_expiry_seconds=5)
    owner = domain.acme.owner
    data = reviews(20)
    upload = _create(domain, owner, len(data))
    (part,) = _parts(domain, owner, upload.row.id, [data])
    folder = uploads.upload_dir(domain.store.settings, owner.tenant_id, upload.row.id)
    assert _used(domain) == len(data)
    time.sleep(max(0.0, upload.row.expires_at - time.time()) + 0.05)
    assert _used(domain) == 0  # an expired upload no longer counts
    with pytest.raises(InvalidInput) as expired:
        uploads.complete(domain.store, owner, upload.row.id, [part], None)
    assert expired.value.code == "upload_expired"
    assert not folder.exists()  # its parts deleted
    assert domain.audit(domain.acme, "file.upload") == []
    assert not any(Path(domain.data_dir, "files").rglob("*.part"))
