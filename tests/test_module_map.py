"""docs/design.md's module map is the code's: every module of the project's packages, with its
docstring's first sentence and each folder's imports (``scripts/module_map.py`` writes it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "scripts/module_map.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_design_page_holds_the_code_s_module_map():
    script = _script()
    page = script.PAGE.read_text()
    assert page == script.page_with_map(page), (
        "docs/design.md's module map differs from the code: run python scripts/module_map.py"
    )


def test_the_map_names_every_module():
    body = _script().module_map()
    for package in ("dprc_core", "service", "api", "worker", "dprc"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "__init__.py" or "migrations" in path.parts:
                continue
            folder = path.parent.relative_to(ROOT)
            assert f"**`{folder}/`**" in body, folder
            assert f"| `{path.name}` |" in body, path
