"""Near copies go to the data owner (issue 40, point 3), over uvicorn on PostgreSQL and SQLite:
a trainer's upload whose lines are a data owner's with one word changed each shares no
canonical key with them, yet its report names the owner's data set with its near duplicates;
the pairs' texts are shown to the data owner, not to the trainer."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from service.store.tables import File
from tests.api.conftest import Server, _serve, _settings


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def srv(request, pg_url, tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"near-{request.param}")
    url = pg_url if request.param == "postgresql" else None
    yield from _serve(_settings(tmp, url, require_budget=True))


def _texts(n: int, seed: int) -> list[str]:
    """``n`` lines of 14 distinct words each from 3000 made-up words: two of them share
    almost no word."""
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7)) for _ in range(3000)
    ]
    return [" ".join(rng.sample(vocab, 14)).capitalize() + "." for _ in range(n)]


def _edited(text: str, i: int) -> str:
    words = text.split()
    words[i % len(words)] = f"edited{i}"
    return " ".join(words)


def _jaccard(a: str, b: str) -> float:
    """Of the two texts' word sets (lower-cased, split at spaces), with Python sets."""
    sa, sb = set(a.lower().split()), set(b.lower().split())
    return len(sa & sb) / len(sa | sb)


def _jsonl(texts: list[str]) -> bytes:
    return ("\n".join(json.dumps({"text": t}) for t in texts) + "\n").encode()


def _upload(http, texts: list[str], **fields: str) -> dict:
    r = http.post(
        "/v1/files",
        files={"file": ("d.jsonl", _jsonl(texts))},
        data={"purpose": "fine-tune", **fields},
    )
    assert r.status_code == 200, r.text
    return r.json()


def _get(http, file_id: str) -> dict:
    r = http.get(f"/v1/files/{file_id}")
    assert r.status_code == 200, r.text
    return r.json()


def test_near_copies_of_an_owners_data_are_reported_to_the_owner(srv):
    owner, trainer = srv.key("near", "data_owner"), srv.key("near", "trainer")
    original = _texts(40, seed=11)
    edited = [_edited(t, i) for i, t in enumerate(original[:20])]
    # one word of 14 changed: 13 shared words of 15, Jaccard 0.867 (>= 0.8)
    assert all(0.8 <= _jaccard(e, t) < 1 for e, t in zip(edited, original))
    unrelated = _texts(10, seed=12)
    assert max(_jaccard(u, t) for u in unrelated for t in original) < 0.3
    with srv.http(owner) as own, srv.http(trainer) as tr:
        base = _upload(own, original, epsilon_budget="2")
        assert base["approval"]["status"] == "approved"
        pending = _upload(tr, edited + unrelated)
        assert pending["approval"]["status"] == "pending"
        # the trainer's own answers carry counts, no text of the owner's
        for seen in (pending, _get(tr, pending["id"])):
            report = seen["approval"]["report"]
            assert report["distinct_examples"] == 30 and report["groups_total"] == 1
            assert report["near_threshold"] == 0.8 and report["near_sample_limited"] is False
            (group,) = report["groups"]
            assert group["budget_group"] == base["budget_group"]
            assert group["shared_examples"] == 0  # no canonical key in common
            # LSH may miss a pair (probability < 0.004 each at J = 0.867); a found pair's
            # Jaccard is computed exactly, so never more than the 20 edited lines
            assert 17 <= group["near_duplicates"] <= 20
            assert group["examples"] is None
        assert original[0] not in json.dumps(_get(tr, pending["id"]))
        # the data owner sees the pairs: the upload's first lines and the texts they copy
        (group,) = _get(own, pending["id"])["approval"]["report"]["groups"]
        assert [e["line"] for e in group["examples"]] == [1, 2, 3]
        for e in group["examples"]:
            i = e["line"] - 1
            assert e["text"] == edited[i] and e["group_text"] == original[i]
            assert e["jaccard"] == pytest.approx(_jaccard(edited[i], original[i]), abs=1e-3)
        queue = own.get("/v1/files", params={"approval": "pending"}).json()["data"]
        listed = next(f for f in queue if f["id"] == pending["id"])
        assert listed["approval"]["report"]["groups"][0]["examples"] == group["examples"]
        # unrelated data: no group at all
        other = _upload(tr, unrelated + _texts(5, seed=13))
        assert other["approval"]["report"]["groups"] == []
        # exact copies count once, as shared examples; the edited lines as near duplicates
        mixed = _upload(tr, original[30:35] + [_edited(t, 3) for t in original[35:40]])
        (group,) = _get(own, mixed["id"])["approval"]["report"]["groups"]
        assert group["shared_examples"] == 5
        assert 4 <= group["near_duplicates"] <= 5
        assert {e["line"] for e in group["examples"]} <= {6, 7, 8, 9, 10}
        # once decided, the quoted private text leaves the database; the counts stay
        r = own.post(f"/v1/files/{pending['id']}/reject", json={"reason": "a copy"})
        assert r.status_code == 200, r.text
        with srv.store.sessions() as session:
            stored = session.scalar(select(File).where(File.id == pending["id"]))
            assert stored is not None and stored.overlap_report is not None
            kept = stored.overlap_report["groups"][0]
        assert kept["examples"] is None and 17 <= kept["near_duplicates"] <= 20
