"""Keyed hashes of a data set's examples, so that one budget covers the same data however
often it is uploaded (:mod:`service.budget_groups`).

Each example's hash is HMAC-SHA256, keyed by a per-tenant secret (32 random bytes in
``DPRC_DATA_DIR/secrets/tenant-<id>.key``, written 0600 once), over the text the model is
trained on: a text line's ``text``, a chat line's messages as the worker joins them
(``role: content`` lines), a classification line's ``text``. The label is left out on
purpose: a relabelled copy holds the same people's text, so it shares the budget. The secret
keeps the stored hashes from being tested against guessed lines by anyone who reads the
database without the data folder.

What hashing cannot catch: a copy in which each line was edited (a changed character, added
whitespace, a different chat role): such a copy is new data to the service.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from dprc_core.training.data import DataError, read_examples, summarize_jsonl
from service.errors import InvalidInput

SECRETS_DIR = "secrets"
_cache: dict[Path, bytes] = {}
_guard = threading.Lock()


def tenant_secret(data_dir: Path, tenant_id: int) -> bytes:
    """The tenant's HMAC key, created (0600, exclusively: concurrent processes agree) on
    first use."""
    path = (data_dir / SECRETS_DIR / f"tenant-{tenant_id}.key").resolve()
    with _guard:
        if path in _cache:
            return _cache[path]
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            value = bytes.fromhex(path.read_text().strip())
        else:
            value = secrets.token_bytes(32)
            with os.fdopen(fd, "w") as out:
                out.write(value.hex())
                out.flush()
                os.fsync(out.fileno())
        if len(value) < 32:
            raise RuntimeError(f"{path} holds a key shorter than 32 bytes")
        _cache[path] = value
        return value


@dataclass(frozen=True)
class HashedData:
    """A validated data set: its number of examples (lines), its format and the distinct
    keyed hashes of its examples (sorted hex)."""

    n_examples: int
    format: str
    digests: list[str]


def hash_examples(data: bytes, secret: bytes) -> HashedData:
    """Validate a fine-tune JSONL file (the worker's own reader,
    :func:`dprc_core.training.data.summarize_jsonl`) and hash its examples; a bad line is
    :class:`InvalidInput` (400, ``param: file``) naming it."""
    try:
        summary = summarize_jsonl(io.BytesIO(data))
        digests = {
            hmac.new(secret, ex.text.encode("utf-8"), hashlib.sha256).hexdigest()
            for ex in read_examples(io.BytesIO(data))
        }
    except DataError as exc:
        raise InvalidInput(str(exc), param="file", code="invalid_jsonl") from exc
    return HashedData(summary.n_examples, summary.format, sorted(digests))
