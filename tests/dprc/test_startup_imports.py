"""Fast starts (issue 45): ``import dprc_core``, ``import dprc_core.accounting``, the modules of
the client's and the accountant's commands, and the commands themselves (``dprc --help``, every
command's ``--help``, usage errors, the library's ``dprc accountant epsilon|sigma``, a client
command against a closed port) import neither torch nor transformers.

Each check runs in a fresh ``python -c WRAPPER`` whose ``sys.meta_path`` finder refuses torch
and transformers (noting every attempt) and which, at exit, writes which watched packages are in
``sys.modules``. The refusal bites: ``from dprc_core import PrivacyEngine`` under the same
wrapper fails (:func:`test_the_refusal_bites`). Not timed: the times are
benchmarks/client_startup.py's (docs/benchmarks/client_startup.md).

The lazy packages themselves (``dprc_core``, ``dprc_core.accounting``: transformers' way, a
module ``__getattr__`` over a name → submodule map) are checked in process below: every name of
``__all__`` is its home module's object, ``dir()`` lists them, submodules are still attributes.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REFUSED = ("torch", "transformers")
WATCHED = (*REFUSED, "dprc_core", "numpy", "dp_accounting", "openai")

WRAPPER = """
import atexit, json, os, sys

REFUSED = set(json.loads(os.environ["REFUSED_IMPORTS"]))
WATCHED = json.loads(os.environ["WATCHED_IMPORTS"])
tried = []


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            tried.append(name)
            raise ImportError(f"{name} is made unimportable by the test")
        return None


sys.meta_path.insert(0, Refuse())


@atexit.register
def report():
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(WATCHED))
    with open(os.environ["IMPORT_REPORT"], "w") as fh:
        json.dump({"tried": tried, "loaded": loaded}, fh)


what, args = sys.argv[1], sys.argv[2:]
if what == "import":
    for name in args:
        __import__(name)
elif what == "exec":
    exec(args[0])
else:
    from dprc.cli import main

    sys.exit(main(args))
"""

# the modules on the client's and the accountant's paths
MODULES = [
    "dprc_core",
    "dprc_core.accounting",
    "dprc_core.accounting.cli_args",
    "dprc_core.accounting.cli",
    "dprc_core.accounting.dpftrl_cli",
    "dprc_core.cli",
    "dprc_core.mechanism_names",
    "dprc.cli",
    "dprc.client.api",
    "dprc.client.commands",
    "dprc.client.remote_accountant",
]
JOB = ["--delta", "1e-5", "-q", "0.01", "--steps", "10", "--envelope", "exact", "--json"]


def _run(
    tmp_path: Path, what: str, *argv: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, list[str]]]:
    report = tmp_path / "imports.json"
    report.unlink(missing_ok=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    e.update(
        DPRC_CLIENT_CONFIG=str(tmp_path / "client.toml"),
        IMPORT_REPORT=str(report),
        REFUSED_IMPORTS=json.dumps(REFUSED),
        WATCHED_IMPORTS=json.dumps(WATCHED),
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, what, *argv],
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, json.loads(report.read_text())


def _no_torch(proc: subprocess.CompletedProcess[str], imports: dict[str, list[str]]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert imports["tried"] == [], imports
    assert not set(REFUSED) & set(imports["loaded"]), imports


@pytest.mark.parametrize("module", MODULES)
def test_the_modules_import_no_torch(tmp_path, module):
    proc, imports = _run(tmp_path, "import", module)
    assert proc.returncode == 0, proc.stderr
    _no_torch(proc, imports)


def test_importing_the_packages_imports_no_accountant_either(tmp_path):
    """``import dprc_core`` and ``import dprc_core.accounting`` are the package and its
    names: neither numpy nor dp_accounting until a name is asked for."""
    proc, imports = _run(tmp_path, "import", "dprc_core", "dprc_core.accounting")
    assert proc.returncode == 0, proc.stderr
    _no_torch(proc, imports)
    assert imports["loaded"] == ["dprc_core"], imports


def test_the_refusal_bites(tmp_path):
    """The engine needs torch: under the wrapper, asking for it fails and is noted."""
    proc, imports = _run(tmp_path, "exec", "from dprc_core import PrivacyEngine")
    assert proc.returncode != 0 and "is made unimportable by the test" in proc.stderr
    assert any(name.split(".")[0] == "torch" for name in imports["tried"]), imports


HELP = [
    ["--help"],
    ["train", "--help"],
    ["synth", "--help"],
    ["demo", "--help"],
    ["serve", "--help"],
    ["keys", "create", "--help"],
    ["admin", "check", "--help"],
    ["jobs", "create", "--help"],
    ["accountant", "sigma", "--help"],
]


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_help_imports_no_torch(tmp_path, argv):
    proc, imports = _run(tmp_path, "dprc", *argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: dprc")
    _no_torch(proc, imports)
    assert "openai" not in imports["loaded"], imports  # the SDK is for requests alone


USAGE_ERRORS = [
    (["accountant", "epsilon", "--sigma", "x"], "invalid float value: 'x'"),
    (["accountant", "epsilon", "--sigma", "1", *JOB, "--mechanism", "dp_sgd"], "choose from"),
    (["train"], "the following arguments are required"),
    (["nonsense"], "invalid choice"),
    (["jobs", "create", "--epochs", "x"], "invalid"),
]


@pytest.mark.parametrize(
    ("argv", "error"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS]
)
def test_usage_errors_import_no_torch(tmp_path, argv, error):
    proc, imports = _run(tmp_path, "dprc", *argv)
    assert proc.returncode == 2, proc.stderr
    assert error in proc.stderr
    _no_torch(proc, imports)
    assert "openai" not in imports["loaded"], imports


def test_the_librarys_accountant_imports_no_torch(tmp_path):
    """``dprc accountant epsilon|sigma`` computed here: the library's accountant (numpy,
    dp_accounting), the same ε as in process, without torch or the client."""
    from dprc_core.accounting import epsilon, noise_multiplier

    proc, imports = _run(tmp_path, "dprc", "accountant", "epsilon", "--sigma", "1.1", *JOB)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["epsilon"] == epsilon(1.1, 0.01, 10, 1e-5, "exact", None)
    _no_torch(proc, imports)
    assert {"dprc_core", "numpy", "dp_accounting"} <= set(imports["loaded"]), imports
    assert "openai" not in imports["loaded"], imports
    sigma = ["accountant", "sigma", "--epsilon", "2", *JOB]
    proc, imports = _run(tmp_path, "dprc", *sigma)
    assert proc.returncode == 0, proc.stderr
    expected = noise_multiplier(2.0, 1e-5, 0.01, 10, "exact")
    assert json.loads(proc.stdout)["noise_multiplier"] == expected
    _no_torch(proc, imports)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "argv", [["files", "list"], ["accountant", "epsilon", "--sigma", "1.1", *JOB, "--server"]]
)
def test_client_commands_against_a_closed_port_import_no_torch(tmp_path, argv):
    url = f"http://127.0.0.1:{_closed_port()}"
    proc, imports = _run(tmp_path, "dprc", *argv, DPRC_API_KEY="dprc-test", DPRC_SERVER_URL=url)
    assert proc.returncode == 2 and f"cannot reach the dprc server at {url}" in proc.stderr
    _no_torch(proc, imports)
    assert "openai" in imports["loaded"], imports  # the client's request was sent


# -- the lazy packages, in process ----------------------------------------------------------


@pytest.mark.parametrize("package", ["dprc_core", "dprc_core.accounting"])
def test_every_lazy_name_is_its_home_modules(package):
    module = importlib.import_module(package)
    assert set(module._LAZY) == set(module.__all__)
    assert set(module.__all__) <= set(dir(module))
    for name, home in module._LAZY.items():
        assert getattr(module, name) is getattr(
            importlib.import_module(f"{package}.{home}"), name
        ), name
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_the_package_keeps_its_names_and_submodules():
    import dprc_core
    from dprc_core import PrivacyEngine
    from dprc_core.engine import PrivacyEngine as home

    assert PrivacyEngine is home and dprc_core.engine.PrivacyEngine is home
    assert dprc_core.__version__ == "0.1.0"
    namespace: dict[str, object] = {}
    exec("from dprc_core import *", namespace)
    assert {n for n in namespace if not n.startswith("__")} == set(dprc_core.__all__)
