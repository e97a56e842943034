"""Tables for people: aligned columns, ``-`` for a missing value, times in UTC."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def number(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


Column = tuple[str, Callable[[Mapping[str, Any]], Any]]


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """``rows`` under the columns' headers, left-aligned, two spaces apart."""
    cells = [[h for h, _ in columns]]
    for row in rows:
        cells.append([_text(get(row)) for _, get in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return number(value)
    return str(value)


def fields(obj: Mapping[str, Any], names: Sequence[str]) -> str:
    """``name: value`` lines of one object."""
    width = max(len(n) for n in names)
    return "\n".join(f"{n.ljust(width)}  {_text(obj.get(n))}" for n in names)
