"""The upload's fast line reader (issue 45, item 4): :func:`read_fields` gives what the full
reader, :func:`read_examples`, gives — the same examples, and the same refusal word for word —
whatever the line, and the numpy-sorted digest runs are Python's ``sorted(set(...))``."""

from __future__ import annotations

import os

import pytest

from dprc_core.training.data import DataError, read_examples, read_fields
from service.data.example_hashes import sorted_distinct

TEXT = b'{"text": "a b", "label": 0}\n'

# lines of the fast path's shapes, and lines next to them that it must leave to the full reader
LINES = [
    TEXT,
    b'{"text": "x12 w28"}\n',
    b'{"text": "x12 w28"}',
    b'{"text":"tight","label":"pos"}\r\n',
    b' \t{ "text" :\t"spaced" , "label" : -7 }  \n',
    b'{"text": "caf\xc3\xa9 \xe2\x80\x8b ZWSP", "label": 1}\n',
    b'{"text": "A\\u00e9 escaped", "label": 1}\n',
    b'{"text": "\\ud800", "label": 1}\n',
    b'{"text": "\xed\xa0\x80 surrogate bytes", "label": 1}\n',
    b'{"text": "\xff", "label": 1}\n',
    b'\xef\xbb\xbf{"text": "bom", "label": 1}\n',
    b'{"text": "tab\tinside", "label": 1}\n',
    b'{"text": "   ", "label": 1}\n',
    b'{"text": "\xc2\xa0\xe3\x80\x80", "label": 1}\n',
    b'{"text": "", "label": 1}\n',
    b'{"text": "a", "label": 01}\n',
    b'{"text": "a", "label": -0}\n',
    b'{"text": "a", "label": 1.0}\n',
    b'{"text": "a", "label": true}\n',
    b'{"text": "a", "label": null}\n',
    b'{"text": "a", "label": 1' + b"2" * 30 + b"}\n",
    b'{"text": "a", "label": "\xe2\x82\xac"}\n',
    b'{"text": "a", "label": ""}\n',
    b'{"label": 1, "text": "order"}\n',
    b'{"text": "a", "label": 1, "label": 2}\n',
    b'{"text": "a", "text": "b"}\n',
    b'{"text": 5, "label": 1}\n',
    b'{"text": "a", "label": 1, "extra": 2}\n',
    b'{"text": "a", "label": 1, "user_id": "u1"}\n',
    b'{"text": "a", "user_id": 7}\n',
    b'{"text": "a", "label": 1}}\n',
    b'{"text": "a", "label": 1} x\n',
    b'{"text": "a", "label": 1}\x0c\n',
    b'{"text": "a" "label": 1}\n',
    b'{"text": "a",}\n',
    b"[1, 2]\n",
    b'"text"\n',
    b"\n",
    b"   \r\n",
    b'{"prompt": "p ", "completion": "c"}\n',
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n',
    b'{"messages": [{"role": "user", "content": "q"}]}\n',
    '{"text": "a str line", "label": 1}\n',
]


def _full(lines: list, user_field: str | None) -> list[tuple] | tuple[str, str]:
    try:
        return [
            (e.format, e.text, e.label, e.user) for e in read_examples(lines, user_field=user_field)
        ]
    except DataError as exc:
        return ("refused", str(exc))


def _fast(lines: list, user_field: str | None) -> list[tuple] | tuple[str, str]:
    try:
        return list(read_fields(lines, user_field))
    except DataError as exc:
        return ("refused", str(exc))


@pytest.mark.parametrize("user_field", [None, "user_id"])
def test_the_fast_reader_reads_and_refuses_as_the_full_one(user_field):
    neighbours = [
        TEXT,
        b'{"text": "plain"}\n',
        b'{"text": "u", "label": 1, "user_id": "a"}\n',
        b'{"text": "u", "label": 1, "user_id": 3}\n',
    ]
    files = [[line] for line in LINES]
    files += [[a, b] for a in neighbours for b in LINES]
    files += [[b, a] for a in neighbours for b in LINES]
    files.append(LINES)
    for lines in files:
        full, fast = _full(lines, user_field), _fast(lines, user_field)
        assert fast == full, lines
        # the same Python types (1 and "1" are two labels to json, one class to label_names)
        if isinstance(full, list) and isinstance(fast, list):
            assert [type(x[2]) for x in fast] == [type(x[2]) for x in full]


def test_numpy_runs_are_sorted_distinct_records():
    edge = [b"\x00" * 32, b"\xff" * 32, b"\x00" * 31 + b"\x01", b"\x80" + b"\x00" * 31]
    records = [os.urandom(32) for _ in range(3000)] + edge * 3
    records += records[:500]
    assert sorted_distinct(b"".join(records), 32) == b"".join(sorted(set(records)))
    pairs = [os.urandom(64) for _ in range(500)] + [b"\x00" * 64] * 2
    assert sorted_distinct(b"".join(pairs), 64) == b"".join(sorted(set(pairs)))
    assert sorted_distinct(b"", 32) == b""
