"""The client's commands (``login``, ``files``, ``jobs``, ``audit``, ``accountant … --server``
and their ``--help``) run with torch, transformers, numpy, scipy and dp_accounting made
unimportable, and import none of those: docs/cli.md, issues 33 and 45.

Each command runs as ``python -c WRAPPER argv…``, where the wrapper puts a ``sys.meta_path``
finder first that refuses those packages (noting every attempt) and, at exit, writes which of
the watched packages were imported, and which ``dprc_core`` modules. The library's own path
(``dprc accountant epsilon`` without ``--server``) imports the accountant (numpy, dp_accounting;
no torch), and fails under the same wrapper: the refusal bites.

The accountant's options and request live in :mod:`dprc_core.accounting.cli_args`, which
imports the library's names (:mod:`dprc_core.mechanism_names`) and step rule
(:mod:`dprc_core.accounting.steps`) and nothing heavy: ``dprc_core`` and
``dprc_core.accounting`` import their names lazily, so ``accountant … --server`` loads these
light modules of the library and no more (:data:`LIGHT`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dprc.client import remote_accountant

REFUSED = ("torch", "transformers", "numpy", "scipy", "dp_accounting")
WATCHED = REFUSED
# the library's modules a client command may load: the lazy packages (and their lazy_import),
# the accountant's options and the names and the step rule they import
LIGHT = {
    "dprc_core",
    "dprc_core.lazy_import",
    "dprc_core.accounting",
    "dprc_core.accounting.cli_args",
    "dprc_core.accounting.steps",
    "dprc_core.mechanism_names",
}

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
    library = sorted(m for m in sys.modules if m.split(".")[0] == "dprc_core")
    with open(os.environ["IMPORT_REPORT"], "w") as fh:
        json.dump({"tried": tried, "loaded": loaded, "library": library}, fh)


from dprc.cli import main

sys.exit(main(sys.argv[1:]))
"""

SIGMA_JOB = ["--sigma", "1.1", "--delta", "1e-5", "-q", "0.01", "--steps", "10"]


def _closed_port() -> int:
    """A local port nobody listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dprc(
    tmp_path: Path, *argv: str, refuse: bool = True, stdin: str = "", **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, list[str]]]:
    """``dprc argv…`` in a subprocess (no server, no key, a private client config unless
    ``env`` says otherwise) and what it imported."""
    report = tmp_path / "imports.json"
    report.unlink(missing_ok=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    e.update(
        DPRC_CLIENT_CONFIG=str(tmp_path / "client.toml"),
        IMPORT_REPORT=str(report),
        REFUSED_IMPORTS=json.dumps(REFUSED if refuse else []),
        WATCHED_IMPORTS=json.dumps(WATCHED),
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, *argv],
        env=e,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, json.loads(report.read_text())


def _assert_light(proc: subprocess.CompletedProcess[str], imports: dict[str, list[str]]) -> None:
    assert "Traceback" not in proc.stderr and "ImportError" not in proc.stderr, proc.stderr
    assert imports["tried"] == [] and imports["loaded"] == [], imports
    assert set(imports["library"]) <= LIGHT, imports


HELP = [
    ["login", "--help"],
    ["files", "list", "--help"],
    ["files", "upload", "--help"],
    ["jobs", "list", "--help"],
    ["jobs", "create", "--help"],
    ["audit", "--help"],
    ["audit", "verify", "--help"],
    ["accountant", "--help"],
    ["accountant", "epsilon", "--help"],
    ["accountant", "sigma", "--server", "--help"],
]


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_client_help_needs_no_torch(tmp_path, argv):
    proc, imports = _dprc(tmp_path, *argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: dprc {argv[0]}")
    _assert_light(proc, imports)


def _one_line_error(proc: subprocess.CompletedProcess[str], text: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("dprc: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert text in proc.stderr


NOT_CONFIGURED = [
    (["files", "list"], "no server"),
    (["files", "list", "--server", "http://127.0.0.1:9"], "no API key"),
    (["jobs", "list", "--server", "http://127.0.0.1:9"], "no API key"),
    (["audit", "list", "--server", "http://127.0.0.1:9"], "no API key"),
    (["accountant", "epsilon", *SIGMA_JOB, "--server"], "no server"),
    (["accountant", "epsilon", *SIGMA_JOB, "--server", "http://127.0.0.1:9"], "no API key"),
    (["accountant", "sigma", "--epsilon", "2", "--delta", "1e-5", "-q", "0.01", "--steps", "50",
      "--server", "http://127.0.0.1:9"], "no API key"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "error"), NOT_CONFIGURED, ids=[" ".join(a) for a, _ in NOT_CONFIGURED]
)
def test_client_commands_without_a_server_or_key_fail_in_one_line_without_torch(
    tmp_path, argv, error
):
    proc, imports = _dprc(tmp_path, *argv)
    _one_line_error(proc, error)
    _assert_light(proc, imports)


@pytest.mark.parametrize(
    "argv",
    [["jobs", "list"], ["accountant", "epsilon", *SIGMA_JOB, "--server"]],
    ids=" ".join,
)
def test_client_commands_reach_for_the_server_without_torch(tmp_path, argv):
    """Past the key: the request is built and sent (to a port nobody listens on)."""
    url = f"http://127.0.0.1:{_closed_port()}"
    proc, imports = _dprc(tmp_path, *argv, DPRC_API_KEY="dprc-test", DPRC_SERVER_URL=url)
    _one_line_error(proc, f"cannot reach the dprc server at {url}")
    _assert_light(proc, imports)


def test_accountant_server_usage_and_job_errors_need_no_torch(tmp_path):
    missing = ["accountant", "epsilon", "--sigma", "1", "--server", "http://127.0.0.1:9"]
    proc, imports = _dprc(tmp_path, *missing)
    assert proc.returncode == 2 and "the following arguments are required: --delta" in proc.stderr
    _assert_light(proc, imports)
    no_steps = ["accountant", "epsilon", "--sigma", "1", "--delta", "1e-5", "-q", "0.01"]
    proc, imports = _dprc(tmp_path, *no_steps, "--server", "http://127.0.0.1:9")
    _one_line_error(proc, "give --sample-rate and --steps")
    _assert_light(proc, imports)
    ftrl = [*no_steps[:-2], "--mechanism", "nu-dpftrl", "--steps", "10"]
    proc, imports = _dprc(tmp_path, *ftrl, "--server", "http://127.0.0.1:9")
    _one_line_error(proc, "--mechanism nu_dpftrl needs --nu")
    _assert_light(proc, imports)


def test_login_saves_the_config_without_torch(tmp_path):
    proc, imports = _dprc(tmp_path, "login", "--server", "http://127.0.0.1:9/v1/", stdin="k\n")
    assert proc.returncode == 0, proc.stderr
    assert "saved the server URL and key" in proc.stderr
    assert 'server_url = "http://127.0.0.1:9"' in (tmp_path / "client.toml").read_text()
    _assert_light(proc, imports)


def test_the_library_path_imports_the_accountant_not_torch(tmp_path):
    """Computing here is the library's accountant: it imports numpy and dp_accounting (no
    torch), and the refusal makes it fail."""
    from dprc_core.accounting import epsilon

    proc, imports = _dprc(tmp_path, "accountant", "epsilon", *SIGMA_JOB, "--json", refuse=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["epsilon"] == epsilon(1.1, 0.01, 10, 1e-5, "exact", None)
    assert {"numpy", "dp_accounting"} <= set(imports["loaded"]), imports
    assert "torch" not in imports["loaded"] and "dprc_core.engine" not in imports["library"]
    assert "dprc_core.accounting.accountant" in imports["library"], imports
    refused, imports = _dprc(tmp_path, "accountant", "epsilon", *SIGMA_JOB)
    assert refused.returncode != 0 and "is made unimportable by the test" in refused.stderr
    assert any(name.split(".")[0] in REFUSED for name in imports["tried"]), imports


# -- in process: the request, the loader and the restated facts ------------------------------


def test_server_request_is_built_from_the_same_arguments(monkeypatch):
    from dprc.cli import main

    sent = []

    def answer(kind, body, args):
        sent.append((kind, body))
        return 0

    monkeypatch.setattr(remote_accountant, "run", answer)
    by_size = ["--dataset-size", "1000", "--batch-size", "10", "--epochs", "2"]
    argv = ["accountant", "epsilon", "--sigma", "1.1", "--delta", "1e-5", *by_size]
    assert main([*argv, "--envelope", "hutch", "--k", "8", "--server", "http://x"]) == 0
    assert main(["accountant", "sigma", "--epsilon", "2", "--delta", "1e-5", *by_size,
                 "--mechanism", "nu-dpftrl", "--nu", "0.1", "--ser"]) == 0  # fmt: skip
    assert sent == [
        ("epsilon", {"sample_rate": 0.01, "steps": 200, "clipping": "hutch", "k": 8,
                     "rank": None, "noise_multiplier": 1.1, "delta": 1e-5}),
        ("sigma", {"mechanism": "nu_dpftrl", "nu": 0.1, "bands": None, "steps": 200,
                   "participations": 2, "min_separation": 100, "target_epsilon": 2.0,
                   "target_delta": 1e-5}),
    ]  # fmt: skip


def test_the_command_uses_the_librarys_names_and_step_rule():
    """The options' names and the step rule are imported from their homes, not restated: the
    same objects as the library's (norm methods, events, the planner)."""
    from dprc_core import mechanism_names, norm_methods
    from dprc_core.accounting import cli_args, events, steps

    assert cli_args.ENVELOPES is norm_methods.ENVELOPES is events.ENVELOPES
    assert cli_args.SKETCHES is events.SKETCHES
    assert (cli_args.SHARED_SKETCH, cli_args.PER_EXAMPLE_SKETCH) == (
        events.SHARED_SKETCH,
        events.PER_EXAMPLE_SKETCH,
    )
    assert (cli_args.GAUSSIAN, cli_args.NU_DPFTRL) == (
        mechanism_names.GAUSSIAN,
        mechanism_names.NU_DPFTRL,
    )
    assert cli_args.planned_steps is steps.planned_steps
    from dprc_core.clipping import DEFAULT_K

    assert cli_args.DEFAULT_K == DEFAULT_K
    for name in (*mechanism_names.NOISE_MECHANISMS, *mechanism_names.LEGACY_NAMES):
        assert cli_args.canonical_mechanism(name) == mechanism_names.canonical_mechanism(name)
    with pytest.raises(argparse.ArgumentTypeError, match="choose from gaussian, nu_dpftrl"):
        cli_args.canonical_mechanism("dp_sgd")


FTRL_JOBS = [
    "--nu 0.1 --dataset-size 100 --batch-size 10 --epochs 2",
    "--nu 0.1 --dataset-size 101 --batch-size 10 --epochs 3",
    "--nu 0.1 --steps 20 --participations 2 --min-separation 10",
    "--nu 0.1 --dataset-size 100 --batch-size 10 --epochs 1.5",
    "--nu 0.1 --dataset-size 100 --batch-size 200 --epochs 1",
    "--nu 0.1 --dataset-size 100 --batch-size 10",
    "--nu 0.1 --dataset-size 100 --batch-size 10 --epochs 2 --steps 20",
    "--nu 0.1 --steps 20 --participations 2",
    "--steps 20 --participations 2 --min-separation 10",
    "--nu 0.1 -q 0.1 --steps 20 --participations 2 --min-separation 10",
    "--nu 0.1 --envelope hutch --steps 20 --participations 2 --min-separation 10",
    "--nu 0.1 --k 8 --steps 20 --participations 2 --min-separation 10",
    "--nu 0.1 --sketch per_example --steps 20 --participations 2 --min-separation 10",
]


@pytest.mark.parametrize("job", FTRL_JOBS)
def test_the_dpftrl_job_rule_is_the_librarys(job):
    from dprc_core.accounting import cli_args, dpftrl_cli

    parser = remote_accountant.build_parser()
    argv = "accountant epsilon --mechanism nu_dpftrl --sigma 1 --delta 1e-5 " + job
    args = parser.parse_args(argv.split())
    outcomes = []
    for rule in (cli_args.dpftrl_job, dpftrl_cli._job):
        try:
            outcomes.append(rule(args))
        except ValueError as exc:
            outcomes.append(f"ValueError: {exc}")
    assert outcomes[0] == outcomes[1]
