"""The pages the scripts write (``docs/benchmarks/<name>.md`` and ``.json``): where they go,
how they are written, the machine they name, and the hand-written parts a rewrite keeps."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = DOCS / "benchmarks"


def shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies in it (as the scripts print it)."""
    path = Path(path)
    return str(path.relative_to(ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else path)


def write_page(path: Path, text: str, note: str = "") -> None:
    """Write ``text`` to ``path`` and say so (``note``: said after the path)."""
    Path(path).write_text(text)
    print(f"wrote {shown(path)}{note}")


def write_json(path: Path, data: Any, *, newline: bool = True, **dumps: Any) -> None:
    """``data`` as JSON into ``path`` (``dumps``: ``json.dumps``'s options; ``newline``: one
    at the end)."""
    Path(path).write_text(json.dumps(data, **dumps) + ("\n" if newline else ""))


def kept(path: Path, start: str, end: str) -> str | None:
    """The hand-written part of the current page between the markers ``start`` and ``end``
    (both included), or None when the page or its markers are missing."""
    text = Path(path).read_text() if Path(path).exists() else ""
    a, b = text.find(start), text.find(end)
    if a < 0 or b < a:
        return None
    return text[a : b + len(end)]


def cpu_model(default: str = "unknown") -> str:
    """The CPU's model name from ``/proc/cpuinfo``, or ``default``."""
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return default
    return m.group(1).strip() if m else default


def git_commit() -> str:
    """The checkout's commit (+ a note when the tree differs from it), or 'unknown'."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
