"""One budget per data, as the model sees it: the token-id sequences of a budget group's jobs.

The canonical key of :mod:`service.data.example_hashes` catches copies whose text differs only in
what every tokenizer ignores; some edits survive it yet tokenize exactly the same for a given
tokenizer (an accent an uncased tokenizer strips, "café" and "cafe"; a character it maps to
its unknown token; text past the ``max_seq_len`` it keeps). Such a copy is the same data to
the model, so it may not get a budget of its own.

A job's tokenized store lists the distinct SHA-256 digests of its examples' token-id sequences
(``sequences.sha256``, :mod:`dprc_core.training.token_store`). Before the job's first step the
worker (:func:`check_and_record`) keys each one with the tenant's secret — HMAC-SHA256 over the
tokenizer's fingerprint and the raw digest, so the stored hashes cannot be tested against
guessed lines without the data folder — and looks them up in ``token_hashes`` for that tenant
and tokenizer:

* a sequence another budget group holds fails the job (``budget_group_overlap``), naming that
  group and the first line that tokenizes as one of its examples; nothing is recorded and no
  step is charged;
* otherwise the sequences the job's group does not hold yet are recorded for it, so that later
  jobs of other groups are checked against them. A sequence the job's own group holds is fine.

All of it is one transaction under the job's group's lock
(:func:`service.budget.budget.lock_group`):
two jobs of one group do not both insert. Two jobs of different groups on the same data may
both find nothing; the unique key (tenant, tokenizer, digest) refuses the second's insert,
which then looks again and finds the first's. Lookups name ``LOOKUP_CHUNK`` digests, inserts
send ``INSERT_CHUNK`` rows; memory is a chunk and a bit a sequence, whatever the store's size.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from dprc_core.training.token_store import TokenStore
from service.budget import budget
from service.data.example_hashes import tenant_secret
from service.store.db import locked_session
from service.store.store import Store
from service.store.tables import File, TokenHash
from service.store.tables import Job as JobRow

LOOKUP_CHUNK = 500  # digests a lookup names
INSERT_CHUNK = 5000  # rows an insert (executemany) sends
ATTEMPTS = 3  # a unique-key refusal (another group's concurrent insert): look again


def keyed(secret: bytes, tokenizer: str, raw: bytes) -> str:
    """The stored hash of one token-id sequence's raw digest for ``tokenizer``."""
    return hmac.new(
        secret, b"dprc/tokens/" + tokenizer.encode() + b"/" + raw, hashlib.sha256
    ).hexdigest()


@dataclass(frozen=True)
class Overlap:
    """Another budget group holds sequences of this job's data: the group holding the most,
    how many it holds, and one of them (its raw digest, to find its line)."""

    group_id: str
    shared: int
    raw: bytes
    others: int  # other groups holding some, besides ``group_id``


@dataclass(frozen=True)
class Recorded:
    sequences: int  # the job's distinct sequences
    added: int  # recorded now for the job's group (the rest it held already)


def job_group(store: Store, job_id: str) -> str | None:
    """The budget group of the job's training file (None: a file without one)."""
    with store.sessions() as session:
        return session.scalar(
            select(File.group_id)
            .join(JobRow, JobRow.training_file_id == File.id)
            .where(JobRow.id == job_id)
        )


def check_and_record(
    store: Store, tenant_id: int, group_id: str, data: TokenStore
) -> Overlap | Recorded:
    """Look up the store's sequences and record those the group lacks (see the module
    docstring), or the overlap with another group (nothing recorded)."""
    secret = tenant_secret(store.settings.data_dir, tenant_id)
    tokenizer = data.tokenizer
    for attempt in range(ATTEMPTS):
        try:
            return _check_and_record(store, tenant_id, group_id, data, secret, tokenizer)
        except IntegrityError:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _keyed_chunks(
    data: TokenStore, secret: bytes, tokenizer: str, size: int
) -> Iterator[list[tuple[str, bytes]]]:
    for chunk in data.sequence_digests(size):
        yield [(keyed(secret, tokenizer, raw), raw) for raw in chunk]


def _check_and_record(
    store: Store, tenant_id: int, group_id: str, data: TokenStore, secret: bytes, tokenizer: str
) -> Overlap | Recorded:
    n = data.n_sequences
    held = bytearray((n + 7) // 8)
    shared: dict[str, int] = {}
    example: dict[str, bytes] = {}
    with locked_session(store.sessions) as session:
        budget.lock_group(session, group_id)
        i = 0
        for chunk in _keyed_chunks(data, secret, tokenizer, LOOKUP_CHUNK):
            found = {
                digest: owner
                for digest, owner in session.execute(
                    select(TokenHash.digest, TokenHash.group_id).where(
                        TokenHash.tenant_id == tenant_id,
                        TokenHash.tokenizer == tokenizer,
                        TokenHash.digest.in_([k for k, _ in chunk]),
                    )
                )
            }
            for j, (key, raw) in enumerate(chunk, start=i):
                owner = found.get(key)
                if owner is None:
                    continue
                held[j >> 3] |= 1 << (j & 7)
                if owner != group_id:
                    shared[owner] = shared.get(owner, 0) + 1
                    example.setdefault(owner, raw)
            i += len(chunk)
        if shared:
            top = min(shared, key=lambda g: (-shared[g], g))
            session.rollback()
            return Overlap(top, shared[top], example[top], len(shared) - 1)
        added = 0
        i = 0
        for chunk in _keyed_chunks(data, secret, tokenizer, INSERT_CHUNK):
            rows = [
                {
                    "tenant_id": tenant_id,
                    "tokenizer": tokenizer,
                    "digest": key,
                    "group_id": group_id,
                }
                for j, (key, _) in enumerate(chunk, start=i)
                if not held[j >> 3] & (1 << (j & 7))
            ]
            i += len(chunk)
            if rows:
                session.execute(insert(TokenHash), rows)
                added += len(rows)
        session.commit()
    return Recorded(n, added)


def line_of_example(path: Path, index: int) -> int | None:
    """The line number (from 1) of the file's ``index``-th example (blank lines hold none)."""
    seen = -1
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                seen += 1
                if seen == index:
                    return number
    return None


def overlap_message(overlap: Overlap, data: TokenStore, path: Path, model: str) -> str:
    """The job's error message: the line, the other group, the tokenizer, what to do."""
    index = data.example_with_sequence(overlap.raw)
    line = line_of_example(path, index) if index is not None else None
    where = f"line {line} of this file" if line is not None else "an example of this file"
    more = f" (and examples of {overlap.others} other data set(s))" if overlap.others else ""
    return (
        f"{where} tokenizes exactly as an example of data set {overlap.group_id} "
        f"(tokenizer of {model}, {data.tokenizer[:12]}): they are the same data to the model; "
        f"{overlap.shared} of this file's {data.n_sequences} distinct token sequences are "
        f"that data set's{more}. Ask a data owner to join this upload to that group"
    )
