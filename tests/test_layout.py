"""Architecture rule (DESIGN.md §1): the library never imports the service packages."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "dprc_core"


def test_dprc_core_does_not_import_api_or_worker():
    offenders = []
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in ("api", "worker"):
                    offenders.append(f"{path.relative_to(CORE.parent)}: {name}")
    assert not offenders, offenders
