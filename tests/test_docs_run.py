"""Every Python and shell block of README.md and docs/*.md runs (issue 33, point 3).

Each fenced block whose info string is ``python``/``py`` or ``bash``/``sh``/``shell``/``console``
is one test case, ``docs/engine.md:123`` (the line of its opening fence). Python blocks run in a
fresh ``.venv/bin/python``, shell blocks with ``bash -euo pipefail`` and the venv's ``bin`` first
on PATH (``dprc``, ``python``, ``torchrun``); ``console`` blocks run their ``$ `` lines. Every
block runs in a fresh temporary folder holding ``data/`` (a link to the repository's data
folder, which the docs name as ``data/demo/...``), offline (``HF_HUB_OFFLINE=1``,
``TRANSFORMERS_OFFLINE=1``), with its own ``DPRC_DATA_DIR`` and client config there; ``curl``
fails on an HTTP error (``--fail-with-body``) so that a refused request fails the block.

HTML comments on the lines right above an opening fence say how a block runs:

* ``<!-- docs-test: skip REASON -->`` — not run; REASON (required) is the skip message. For
  blocks that need Docker, a GPU, several hosts, a server in the foreground, or the whole suite.
* ``<!-- docs-test: continues -->`` — runs after the previous block of the same language in
  the same file (and that block's own chain), as one program: Python blocks share one
  namespace; shell blocks are one script.
* ``<!-- docs-test: needs server -->`` — runs against a real local ``dprc serve`` (SQLite,
  built-in models, no worker: jobs stay queued) started once for the module. The block gets an
  admin key of a tenant of its own, as ``$KEY``/``$ADMIN`` and ``DPRC_API_KEY`` (Python: the
  globals ``KEY``, ``ADMIN``), the server's address as ``$URL`` and ``DPRC_SERVER_URL``
  (Python: ``URL``), the server's ``DPRC_DATA_DIR`` (so ``dprc keys`` acts on its store) and a
  ``train.jsonl`` of 40 labelled reviews; ``127.0.0.1:8000`` and ``localhost:8000`` in the
  block are replaced by the server's address.
* ``<!-- docs-test: needs server with worker -->`` — the same with a server of its own whose
  embedded worker runs the jobs (a block that follows a job to its end).
* ``<!-- docs-test: needs job.yaml -->`` — the folder holds ``job.yaml``: a job of a few steps
  of a tiny random Llama (byte-level tokenizer, built locally) on 32 short texts.
* ``<!-- docs-test: torchrun N -->`` — a Python block run by ``torchrun --standalone
  --nproc-per-node N`` (gloo, CPU).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.serve_process import dprc_serve

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
BIN = VENV_BIN if (VENV_BIN / "python").exists() else Path(sys.executable).parent
PYTHON = BIN / "python" if (BIN / "python").exists() else Path(sys.executable)
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {
    "python": "python",
    "py": "python",
    "bash": "shell",
    "sh": "shell",
    "shell": "shell",
    "console": "console",
}
TIMEOUT_S = 120  # per block; a chain or a server block gets the same
SERVER_TIMEOUT_S = 400  # a block that trains through the server (--follow) waits for the job

OPEN_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<body>.*?)\s*-->$")
COMMENT = re.compile(r"^<!--.*-->$")
DIRECTIVES = re.compile(
    r"^(skip \S.*|continues|needs server|needs server with worker|needs job\.yaml|torchrun \d+)$"
)


@dataclass
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    info: str
    code: str
    markers: list[str] = field(default_factory=list)
    marker_lines: list[int] = field(default_factory=list)  # 1-based lines of the markers

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def language(self) -> str | None:
        return LANGUAGES.get(self.info.lower())

    def marker(self, name: str) -> str | None:
        """The rest of the first marker starting with ``name`` ('' when nothing follows)."""
        for m in self.markers:
            if m == name or m.startswith(name + " "):
                return m[len(name) :].strip()
        return None


def _blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    rel = path.relative_to(ROOT).as_posix()
    i = 0
    while i < len(lines):
        m = OPEN_FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        close = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1 : j]]
        markers: list[str] = []
        marker_lines: list[int] = []
        k = i - 1
        while k >= 0 and COMMENT.match(lines[k].strip()):
            mm = MARKER.match(lines[k].strip())
            if mm:
                markers.insert(0, mm["body"])
                marker_lines.insert(0, k + 1)
            k -= 1
        yield Block(rel, i + 1, m["info"], "\n".join(body) + "\n", markers, marker_lines)
        i = j + 1


ALL_BLOCKS = [b for f in DOC_FILES for b in _blocks(f)]
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.language]


def _chain(block: Block) -> list[Block]:
    """The blocks a ``continues`` block runs after (same file and language), then itself."""
    same = [b for b in RUN_BLOCKS if b.path == block.path and b.language == block.language]
    chain = [block]
    at = same.index(block)
    while chain[0].marker("continues") is not None:
        at -= 1
        if at < 0:
            pytest.fail(f"{block.id}: 'continues' with no earlier {block.language} block")
        chain.insert(0, same[at])
    return chain


# ------------------------------------------------------------------ environment and setup


def _base_env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.pop("PYTHONPATH", None)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        XDG_CONFIG_HOME=str(workdir / ".config"),
        DPRC_CLIENT_CONFIG=str(workdir / ".config" / "dprc" / "client.toml"),
        DPRC_DATA_DIR=str(workdir / "dprc-data"),
        DPRC_LOG_LEVEL="warning",
        PYTHONUNBUFFERED="1",
    )
    return env


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "data").symlink_to(ROOT / "data", target_is_directory=True)
    return work


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run in a session of its own; on a timeout the whole group (torchrun's ranks, a server
    the block started) is ended."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, out + f"\n[timed out after {timeout:.0f} s]"


@dataclass
class DocsServer:
    url: str
    data_dir: Path
    env: dict[str, str]
    _tenants: int = 0

    def admin_key(self) -> str:
        """An admin key of a new tenant: each block's files, budgets and jobs are its own."""
        self._tenants += 1
        done = subprocess.run(
            [str(BIN / "dprc"), "keys", "create", "--tenant", f"docs{self._tenants}"]
            + ["--role", "admin"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def _docs_server(tmp: Path, worker: bool) -> Iterator[DocsServer]:
    """``dprc serve`` on a free port, SQLite under ``tmp``; with ``worker`` the embedded worker
    runs the jobs, else they stay queued."""
    env = _base_env(tmp)
    env["DPRC_DATA_DIR"] = str(tmp / "data")
    env["DPRC_EMBEDDED_WORKER"] = "true" if worker else "false"
    with dprc_serve([str(BIN / "dprc")], env, tmp / "server.log", cwd=tmp) as url:
        yield DocsServer(url, tmp / "data", env)


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory) -> Iterator[DocsServer]:
    """One server for the module's ``needs server`` blocks; no worker: jobs stay queued."""
    yield from _docs_server(tmp_path_factory.mktemp("docs-server"), worker=False)


@pytest.fixture()
def docs_worker_server(tmp_path_factory) -> Iterator[DocsServer]:
    """A server of its own, with the embedded worker, for a ``needs server with worker`` block."""
    yield from _docs_server(tmp_path_factory.mktemp("docs-worker-server"), worker=True)


def _write_train_jsonl(path: Path, n: int = 40) -> None:
    lines = (ROOT / "data" / "demo" / "reviews_train.jsonl").read_text().splitlines()[:n]
    path.write_text("\n".join(lines) + "\n")


def _write_job_yaml(work: Path) -> None:
    """A tiny job: a random 2-layer Llama (hidden 32, byte-level tokenizer) on 32 texts."""
    texts = [{"text": ("ab", "cd", "ef")[i % 3] * (4 + i % 5)} for i in range(32)]
    (work / "tiny-train.jsonl").write_text("\n".join(json.dumps(t) for t in texts) + "\n")
    build = (
        "from dprc_core.training.tiny import build_tiny_llama\n"
        "build_tiny_llama('tiny-llama', hidden=32, layers=2, max_positions=64, tokenizer='byte')\n"
    )
    env = _base_env(work)
    code, out = _run([str(PYTHON), "-c", build], work, env, TIMEOUT_S)
    assert code == 0, out
    spec = {
        "model": "tiny-llama",
        "task": "causal_lm",
        "train_file": "tiny-train.jsonl",
        "output_dir": "runs/tiny",
        "epochs": 1,
        "batch_size": 8,
        "max_seq_len": 16,
        "target_epsilon": 8,
        "norm_method": "hutch",
        "k": 8,
        "seed": 0,
    }
    (work / "job.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in spec.items()))


# ------------------------------------------------------------------ running one block

# Python: each block is compiled with its own file name and line numbers (tracebacks point
# into the .md file) and run in the __main__ namespace, after the blocks it continues.
PY_DRIVER = textwrap.dedent(
    """\
    import json, os, sys
    import __main__

    ns = __main__.__dict__
    for name in json.loads(os.environ.get("DOCS_TEST_GLOBALS", "[]")):
        ns[name] = os.environ[name]
    for path, line, code in json.load(open(sys.argv[1], encoding="utf-8")):
        exec(compile("\\n" * line + code, path, "exec"), ns)
    """
)

SH_PREAMBLE = 'curl() { command curl --fail-with-body "$@"; }\n'


def _console_commands(code: str) -> str:
    """The commands of a console transcript: its ``$ `` lines (with their ``\\`` continuations)."""
    out, more = [], False
    for line in code.splitlines():
        if more or line.startswith("$ "):
            out.append(line[2:] if not more else line)
            more = line.rstrip().endswith("\\")
    return "\n".join(out) + "\n"


def _params() -> list:
    params = []
    for b in RUN_BLOCKS:
        marks = []
        if b.marker("needs server") is not None:
            marks.append(pytest.mark.services)
        params.append(pytest.param(b, id=b.id, marks=marks))
    return params


@pytest.mark.slow  # about 40 subprocesses of a few to 150 s each: minutes in all
@pytest.mark.parametrize("block", _params())
def test_doc_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reason = block.marker("skip")
    if reason is not None:
        assert reason, f"{block.id}: 'docs-test: skip' needs a reason"
        pytest.skip(f"{block.id}: {reason}")
    chain = _chain(block)
    work = _workdir(tmp_path)
    env = _base_env(work)
    timeout: float = TIMEOUT_S
    replace: dict[str, str] = {}
    needs = [b.marker("needs server") for b in chain if b.marker("needs server") is not None]
    if needs:
        worker = "with worker" in needs
        server: DocsServer = request.getfixturevalue(
            "docs_worker_server" if worker else "docs_server"
        )
        key = server.admin_key()
        env.update(
            KEY=key,
            ADMIN=key,
            URL=server.url,
            DPRC_API_KEY=key,
            DPRC_SERVER_URL=server.url,
            DPRC_DATA_DIR=str(server.data_dir),
            DOCS_TEST_GLOBALS=json.dumps(["KEY", "ADMIN", "URL"]),
        )
        host = server.url.removeprefix("http://")
        replace = {"127.0.0.1:8000": host, "localhost:8000": host}
        _write_train_jsonl(work / "train.jsonl")
        timeout = SERVER_TIMEOUT_S if worker else TIMEOUT_S
    if any(b.marker("needs job.yaml") is not None for b in chain):
        _write_job_yaml(work)

    def text(b: Block) -> str:
        code = b.code if b.language != "console" else _console_commands(b.code)
        for old, new in replace.items():
            code = code.replace(old, new)
        return code

    if block.language == "python":
        (work / ".docs_driver.py").write_text(PY_DRIVER)
        payload = [[str(ROOT / b.path), b.line, text(b)] for b in chain]
        (work / ".docs_blocks.json").write_text(json.dumps(payload))
        argv = [str(PYTHON), ".docs_driver.py", ".docs_blocks.json"]
        nproc = block.marker("torchrun")
        if nproc is not None:
            argv = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", *argv[1:]]
    else:
        script = SH_PREAMBLE + "".join(text(b) for b in chain)
        (work / ".docs_block.sh").write_text(script)
        argv = ["bash", "-euo", "pipefail", ".docs_block.sh"]
    code, out = _run(argv, work, env, timeout)
    if code != 0:
        shown = "\n\n".join(f"--- {b.id} ({b.info})\n{text(b)}" for b in chain)
        pytest.fail(f"{block.id} exited with {code}\n{shown}\n--- output\n{out[-6000:]}")


# ------------------------------------------------------------------ the markers themselves


def test_markers_are_known_and_sit_on_a_block() -> None:
    problems = []
    blocks = [b for f in DOC_FILES for b in _blocks(f)]  # as the files are now
    fenced = {(b.path, n) for b in blocks for n in b.marker_lines}
    for path in DOC_FILES:
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            m = MARKER.match(line.strip())
            if not m:
                continue
            if not DIRECTIVES.match(m["body"]):
                problems.append(f"{rel}:{n}: not a docs-test marker: {m['body']!r}")
            if (rel, n) not in fenced:
                problems.append(f"{rel}:{n}: docs-test marker not right above a block")
    for b in blocks:
        if b.markers and b.language is None:
            problems.append(f"{b.id}: docs-test marker on a ```{b.info} block (never run)")
    assert not problems, "\n".join(problems)


def test_the_blocks_are_found() -> None:
    assert len(RUN_BLOCKS) >= 30, [b.id for b in RUN_BLOCKS]
    assert shutil.which("bash")
