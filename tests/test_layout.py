"""Architecture rules (docs/api.md, "Layout"): which top-level packages may import which.

* ``dprc_core`` (the library) imports none of the service packages;
* ``service`` (the domain layer) imports neither ``api``, ``worker`` nor ``dprc``;
* ``api`` (HTTP) never imports ``worker`` or ``dprc``; ``worker`` never imports ``api`` or
  ``dprc``: the dispatcher is injected by the composition root ``dprc``.
* ``api`` reaches the database only through ``service``: it imports neither
  ``service.store.tables`` (the ORM rows), ``service.store.db`` (engine, sessions, locks) nor
  ``sqlalchemy``. The use cases live in ``service`` and return rows or domain objects;
  ``api`` converts them to its schemas (``api/<domain>/views.py``).
* ``dprc`` (the CLI and the composition root) calls ``service``, not ``api``: the one module
  of ``dprc`` that imports ``api`` is ``dprc/app.py``, which builds the app ``dprc serve``
  runs (``api.app.create_app`` with the dispatcher). ``dprc.client`` talks to a server over
  HTTP and imports none of ``api``, ``service`` or ``worker``.

* ``benchmarks`` never imports ``tests``; ``tests`` imports of ``benchmarks`` only
  ``benchmarks.kit``.

Every ``.py`` file is walked, function-local imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "dprc_core": {"api", "worker", "service", "dprc", "inference"},
    # the engine is a process of its own: the service starts it and talks HTTP to it
    "service": {"api", "worker", "dprc", "inference"},
    "api": {"worker", "dprc", "inference"},
    "worker": {"api", "dprc", "inference"},
    "inference": {"api", "service", "worker", "dprc"},  # the engine process: dprc_core only
}


def imported_packages(path: Path) -> list[str]:
    """The absolute module names ``path`` imports, anywhere in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_layering(package):
    files = list((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in imported_packages(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert not offenders, offenders


# modules a package must not import, by dotted prefix (a module or any module below it)
FORBIDDEN_MODULES = {
    "api": ("service.store.tables", "service.store.db", "sqlalchemy"),
    "dprc/client": ("api", "service", "worker"),
}
# the only module of ``dprc`` allowed to import ``api``: the composition root
API_IMPORTERS_IN_DPRC = {"dprc/app.py"}


def _is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("folder", sorted(FORBIDDEN_MODULES))
def test_package_avoids_the_modules_below_its_layer(folder):
    files = list((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in imported_packages(path)
        if any(_is_under(name, prefix) for prefix in FORBIDDEN_MODULES[folder])
    ]
    assert not offenders, offenders


def test_only_the_composition_root_of_dprc_imports_api():
    importers = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "dprc").rglob("*.py")
        if any(_is_under(name, "api") for name in imported_packages(path))
    }
    assert importers <= API_IMPORTERS_IN_DPRC, sorted(importers - API_IMPORTERS_IN_DPRC)


def test_no_relative_imports_escape_the_rules():
    """Relative imports would slip past the walk above; the service packages use none."""
    offenders = []
    for package in ("service", "api", "worker", "dprc"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level > 0
            ]
    assert not offenders, offenders


# ``service`` is built in rooms, each over the ones before it (docs/design.md, "Module map"):
# a module imports only from its own room and the rooms listed before it.
SERVICE_ROOMS = (
    "base",
    "store",
    "governance",
    "budget",
    "data",
    "models",
    "inference",
    "jobs",
    "synthetic",
    "admin",
)


def _service_room(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "service" and len(parts) > 1 else None


def test_every_service_module_lives_in_a_room():
    loose = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "service").glob("*.py") if p.name != "__init__.py"
    )
    assert not loose, loose
    rooms = sorted(
        p.name for p in (ROOT / "service").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )
    assert rooms == sorted(SERVICE_ROOMS), rooms


def test_service_rooms_import_only_the_rooms_below():
    offenders = []
    for i, room in enumerate(SERVICE_ROOMS):
        allowed = set(SERVICE_ROOMS[: i + 1])
        for path in (ROOT / "service" / room).rglob("*.py"):
            for name in imported_packages(path):
                target = _service_room(name)
                if name == "service" or (target is not None and target not in allowed):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")


def _imports_of(folder: str) -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(ROOT)), name)
        for path in (ROOT / folder).rglob("*.py")
        for name in imported_packages(path)
    ]


def test_benchmarks_and_tests_meet_only_in_the_kit():
    """No benchmark imports ``tests``; a test imports of ``benchmarks`` only ``benchmarks.kit``
    (what tests guard of a benchmark lives there, not in a script)."""
    offenders = [
        f"{path}: {name}" for path, name in _imports_of("benchmarks") if _is_under(name, "tests")
    ]
    offenders += [
        f"{path}: {name}"
        for path, name in _imports_of("tests")
        if _is_under(name, "benchmarks") and not _is_under(name, "benchmarks.kit")
    ]
    assert not offenders, offenders


# The noise mechanisms own their rules (dprc_core/noise/mechanisms.py): nothing else compares
# a mechanism's name or tests an object's mechanism class; code asks the mechanism's
# capabilities. The data migrations read stored names of history (service/migrations).
MECHANISM_NAMES = {"gaussian", "nu_dpftrl", "dp-sgd", "nu-dp-ftrl", "nu-dpftrl"}
MECHANISM_CONSTANTS = {"GAUSSIAN", "NU_DPFTRL"}
MECHANISM_CLASSES = {"Gaussian", "NuDPFTRL"}
MECHANISM_HOMES = {"dprc_core/noise/mechanisms.py", "dprc_core/mechanism_names.py"}


def _names_a_mechanism(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_mechanism(e) for e in node.elts)
    if isinstance(node, ast.Constant) and node.value in MECHANISM_NAMES:
        return True
    if isinstance(node, ast.Name) and node.id in MECHANISM_CONSTANTS:
        return True
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and isinstance(node.value, ast.Name)
        and node.value.id in MECHANISM_CLASSES
    )


def mechanism_branches(path: Path) -> list[int]:
    """Lines of ``path`` that compare with a mechanism's name or test for a mechanism class."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_a_mechanism(s) for s in sides):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            kinds = node.args[1]
            names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(isinstance(k, ast.Name) and k.id in MECHANISM_CLASSES for k in names):
                lines.append(node.lineno)
    return lines


def test_nothing_outside_the_mechanism_classes_branches_on_a_mechanism():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in ("dprc_core", "service", "api", "worker", "dprc")
        for path in (ROOT / package).rglob("*.py")
        if str(path.relative_to(ROOT)) not in MECHANISM_HOMES and "migrations" not in path.parts
        for line in mechanism_branches(path)
    ]
    assert not offenders, offenders


def test_the_mechanism_branch_finder_finds_branches(tmp_path):
    """The rule above can fail: each form it looks for is found."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "if m == 'nu_dpftrl': pass\n"
        "if m.name != Gaussian.name: pass\n"
        "if x in (NU_DPFTRL,): pass\n"
        "if isinstance(n, (Gaussian, int)): pass\n"
        "if m.sampling == 'fixed_order': pass\n"
    )
    assert mechanism_branches(probe) == [1, 2, 3, 4]


def test_every_benchmark_script_stands_on_the_kit():
    """Issue 41: the scripts share benchmarks/kit (paths, pages, memory, timing, servers)."""
    scripts = [
        p
        for p in (ROOT / "benchmarks").glob("*.py")
        if p.name not in ("__init__.py", "_bootstrap.py")
    ]
    assert scripts
    loose = [
        p.name
        for p in scripts
        if not any(
            _is_under(n, "benchmarks.kit") or n == "benchmarks" for n in imported_packages(p)
        )
    ]
    assert not loose, loose
