"""A key made on the server's shell (``dprc keys create``), as the scripts here need one."""

from __future__ import annotations

import subprocess
from pathlib import Path


def shell_key(dprc: list[str], env: dict[str, str], cwd: Path, tenant: str, role: str) -> str:
    """The secret of a new ``role`` key of ``tenant`` (the tenant is created on demand)."""
    return subprocess.run(
        [*dprc, "keys", "create", "--tenant", tenant, "--role", role],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=cwd,
    ).stdout.strip()
