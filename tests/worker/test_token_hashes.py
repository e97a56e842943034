"""A copy that the canonical text key calls new but that tokenizes exactly as another budget
group's data is the same data to the model (service/data/token_hashes.py): a job on it fails before
its first step (``budget_group_overlap``), naming that group and a line, with nothing charged
and nothing recorded; a job whose sequences are all new passes the check, records them and
trains. (A group's own sequences, chunking, and racing groups: tests/service.)
MiniLM's uncased tokenizer strips accents: "café" and "cafe" are two canonical keys, one token
sequence. SQLite, the embedded worker (the same task code as Celery)."""

from __future__ import annotations

import json

from sqlalchemy import func, select

from service.data.example_hashes import canonical_text
from service.store.tables import TokenHash
from tests.worker.conftest import wait_for

WORDS = ["crème", "brûlée", "café", "naïve", "résumé", "déjà", "élan", "façade"]


def _accented(i: int) -> str:
    return f"{WORDS[i % 8]} number {i} was {WORDS[(3 * i + 1) % 8]}"


def _plain(text: str) -> str:
    return text.translate(str.maketrans("èûéïàç", "eueiac"))


def _file(texts: list[str]) -> bytes:
    lines = (json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts))
    return "".join(lines).encode()


def _job(client, file_id: str):
    return client.fine_tuning.jobs.create(
        model="minilm-l6-v2",
        training_file=file_id,
        hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 16},
        extra_body={"privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}}},
    )


def _upload(client, name: str, texts: list[str]):
    return client.files.create(
        file=(name, _file(texts)), purpose="fine-tune", extra_body={"epsilon_budget": 5.0}
    )


def _events(client, job_id: str) -> list[str]:
    return [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100).data]


def _rows(server, group_id: str) -> int:
    with server.store.sessions() as session:
        return int(
            session.scalar(
                select(func.count()).select_from(TokenHash).where(TokenHash.group_id == group_id)
            )
            or 0
        )


def test_a_copy_that_tokenizes_the_same_fails_before_step_1(embedded):
    client = embedded.client(embedded.key("tokhash", "admin"))
    a_texts = [_accented(i) for i in range(24)]
    b_texts = [_plain(t) for t in a_texts]
    assert all(canonical_text(a) != canonical_text(b) for a, b in zip(a_texts, b_texts))
    a = _upload(client, "a.jsonl", a_texts)
    b = _upload(client, "b.jsonl", b_texts)
    group_a, group_b = a.model_extra["budget_group"], b.model_extra["budget_group"]
    assert group_a != group_b  # the canonical key sees two data sets

    first = wait_for(client, _job(client, a.id).id, {"succeeded", "failed"})
    assert first.status == "succeeded", first.error
    assert any(
        m.startswith("Checked the data's 24 distinct token sequences") and "24 newly" in m
        for m in _events(client, first.id)
    )
    assert _rows(embedded, group_a) == 24

    copy = wait_for(client, _job(client, b.id).id, {"succeeded", "failed"})
    assert copy.status == "failed"
    error = copy.error.model_dump()
    assert error["code"] == "budget_group_overlap", error
    assert f"tokenizes exactly as an example of data set {group_a}" in error["message"]
    assert "24 of this file's 24 distinct token sequences" in error["message"]
    assert copy.model_extra["steps_done"] == 0
    budget = client.files.retrieve(b.id).model_extra["budget"]
    assert budget["spent"] == 0.0 and budget["committed"] == 0.0
    assert _rows(embedded, group_b) == 0  # nothing recorded for the copy's group

    # one shared line among new ones: named by its line number
    c_texts = [f"a wholly new sentence {i}" for i in range(24)]
    head, rest = a_texts[2].split(" ", 1)
    c_texts[6] = f"{_plain(head)} {rest}"  # A's line 3, one accent of two stripped: new to B too
    assert canonical_text(c_texts[6]) not in {
        canonical_text(a_texts[2]),
        canonical_text(b_texts[2]),
    }
    c = _upload(client, "c.jsonl", c_texts)
    assert c.model_extra["budget_group"] not in (group_a, group_b)
    one = wait_for(client, _job(client, c.id).id, {"succeeded", "failed"})
    assert one.error.code == "budget_group_overlap"
    assert one.error.message.startswith(
        f"line 7 of this file tokenizes exactly as an example of data set {group_a}"
    )
