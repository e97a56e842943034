"""Finding the ranks torchrun started below a process (tests kill them by rank)."""

from __future__ import annotations

from pathlib import Path


def rank_pids(root: int) -> dict[int, int]:
    """LOCAL_RANK -> pid of the torchrun ranks below process ``root``."""
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for item in env:
            if item.startswith(b"LOCAL_RANK="):
                found[int(item.split(b"=")[1])] = pid
    return found
