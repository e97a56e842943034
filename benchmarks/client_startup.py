"""Start-up time of the ``dprc`` commands: each run in a fresh process, N wall times a row.

Targets (issue 45): ``dprc --help``, every client command (and its ``--help``) and every
argument error ≤ 1 s; ``dprc accountant epsilon|sigma`` computed by the library's own
accountant (no server) ≤ 2 s. A row passes when the median of its runs is within its target
(the best is shown beside it). No command imports torch to start
(tests/dprc/test_startup_imports.py checks that).

The commands that talk to a server talk to a stub started here (a thread in this process that
answers every request at once with a small JSON body: an empty list page, or a fixed
accountant answer), so what is timed is start-up and one quick round trip, not the ``openai``
SDK's retries of a refused connection (about 1.2 s against a closed port). Every command runs
as the installed ``dprc`` console script with this checkout first on ``PYTHONPATH``.

    .venv/bin/python benchmarks/client_startup.py [--runs 5]   # docs/benchmarks/client_startup.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT, cpu_model, git_commit, write_page  # noqa: E402

DPRC = Path(sys.executable).parent / "dprc"
JOB = ["--sigma", "1.1", "--delta", "1e-5", "-q", "0.01", "--steps", "10"]
SIGMA_JOB = ["--epsilon", "2", "--delta", "1e-5", "-q", "0.01", "--steps", "10"]
CLIENT_TARGET = 1.0
LIBRARY_TARGET = 2.0
SERVER = "{server}"  # replaced by the stub's URL

# (argv, kind, the exit status it should end with)
ROWS: list[tuple[list[str], str, int]] = [
    (["--help"], "help", 0),
    (["login", "--help"], "help", 0),
    (["files", "list", "--help"], "help", 0),
    (["jobs", "list", "--help"], "help", 0),
    (["audit", "--help"], "help", 0),
    (["accountant", "epsilon", "--help"], "help", 0),
    (["train", "--help"], "help", 0),
    (["files", "list", "--server", SERVER], "client", 0),
    (["jobs", "list", "--server", SERVER], "client", 0),
    (["accountant", "epsilon", *JOB, "--envelope", "exact", "--server", SERVER], "client", 0),
    (["accountant", "epsilon", "--sigma", "x"], "argument error", 2),
    (["jobs", "create", "--epochs", "x"], "argument error", 2),
    (["trian"], "argument error", 2),
    (["accountant", "epsilon", *JOB, "--envelope", "exact"], "library accountant", 0),
    (["accountant", "sigma", *SIGMA_JOB, "--envelope", "exact"], "library accountant", 0),
]


class _Stub(BaseHTTPRequestHandler):
    """A dprc server that answers at once: an empty list for a GET, a fixed result for the
    accountant."""

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._answer({"object": "list", "data": [], "has_more": False})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"object": "accountant.epsilon", "epsilon": 0.27178, "delta": 1e-5})

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_runs(
    argv: list[str], runs: int, env: dict[str, str]
) -> tuple[list[float], list[float], int]:
    """Wall times and CPU times (user + system) of ``runs`` fresh runs, and their exit status
    (-1 if it varied)."""
    times, cpu, codes = [], [], set()
    for _ in range(runs):
        c0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run([str(DPRC), *argv], env=env, capture_output=True, timeout=120)
        times.append(time.perf_counter() - t0)
        cpu.append(_children_cpu() - c0)
        codes.add(proc.returncode)
    return times, cpu, codes.pop() if len(codes) == 1 else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "client_startup.md"))
    args = ap.parse_args()
    stub = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{stub.server_address[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env["DPRC_CLIENT_CONFIG"] = str(Path(os.devnull))
    env["DPRC_API_KEY"] = "dprc-benchmark-key"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    load_start = os.getloadavg()[0]
    rows = []
    for argv, kind, expected in ROWS:
        argv = [url if a == SERVER else a for a in argv]
        times, cpu, code = timed_runs(argv, args.runs, env)
        target = LIBRARY_TARGET if kind == "library accountant" else CLIENT_TARGET
        median = statistics.median(times)
        ok = median <= target and code == expected
        cpu_median = statistics.median(cpu)
        rows.append((argv, kind, target, min(times), median, cpu_median, code, expected, ok))
        print(f"{'PASS' if ok else 'FAIL'} {median:.2f} s  dprc {' '.join(argv)}", flush=True)
    stub.shutdown()
    overall = "PASS" if all(r[-1] for r in rows) else "FAIL"
    failed = [f"`dprc {' '.join(r[0]).replace(url, '<stub>')}`" for r in rows if not r[-1]]
    slowest = {
        lib: max(r[4] for r in rows if (r[1] == "library accountant") == lib)
        for lib in (False, True)
    }
    verdict = (
        f"**{overall}: the slowest of `--help`, client commands and argument errors takes "
        f"{slowest[False]:.2f} s (target ≤ {CLIENT_TARGET:.0f} s), the slowest library "
        f"`dprc accountant epsilon|sigma` {slowest[True]:.2f} s (target ≤ "
        f"{LIBRARY_TARGET:.0f} s), medians of {args.runs} runs"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + ".**"
    )
    load = os.getloadavg()
    lines = [
        "# Commands: start-up time (`dprc --help`, the client, the accountant)",
        "",
        f"`benchmarks/client_startup.py --runs {args.runs}` at {git_commit()}; "
        f"{cpu_model()}, {os.cpu_count()} cores (shared: 1-minute load average "
        f"{load_start:.2f} when the run began, {load[0]:.2f} when it ended), Python "
        f"{platform.python_version()}. Each command is the installed `dprc` console script in "
        "a fresh process, this checkout first on `PYTHONPATH`; "
        f"{args.runs} wall times a row.",
        "",
        "Targets (issue 45): `dprc --help`, every client command and its `--help`, and every "
        f"argument error ≤ {CLIENT_TARGET:.0f} s; `dprc accountant epsilon|sigma` computed by "
        f"the library's own accountant (no server) ≤ {LIBRARY_TARGET:.0f} s. A row passes when "
        "the **median** of its wall times is within its target and the command ends with the "
        "exit status it should (0, or 2 for an argument error). The CPU column (user + system "
        "time of the process) is what the command costs whatever the machine's load; the "
        "wall time is the CPU time stretched by the other work on the cores.",
        "",
        "The commands that talk to a server (`--server <stub>`) talk to a stub that this script "
        "starts (a thread answering every request at once: an empty list page, or a fixed "
        "accountant answer), so their time is start-up and one quick round trip. Earlier runs "
        "pointed them at a closed port, which added the `openai` SDK's retries of the refused "
        "connection (about 1.2 s) to their time.",
        "",
        verdict,
        "",
        "| command | kind | target (s) | best (s) | median (s) | CPU, median (s) | exit | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for argv, kind, target, best, median, cpu_median, code, expected, ok in rows:
        shown = " ".join(argv).replace(url, "<stub>")
        exit_text = str(code) if code == expected else f"{code} (expected {expected})"
        lines.append(
            f"| `dprc {shown}` | {kind} | ≤ {target:.0f} | {best:.2f} | {median:.2f} | "
            f"{cpu_median:.2f} | {exit_text} | {'PASS' if ok else 'FAIL'} |"
        )
    lines += [
        "",
        "Why they are fast: `dprc_core` and `dprc_core.accounting` import their names lazily "
        "(a module `__getattr__` over a name → submodule map, as `transformers` does), so no "
        "command imports torch to start. `--help` and argument errors import neither the "
        "`openai` SDK nor numpy; a command that sends a request imports the SDK (about 0.3 s "
        "on an idle machine, most of the client rows); the library's accountant imports "
        "numpy, SciPy (`scipy.signal` alone about 0.7 s) and `dp_accounting` only to compute. "
        "On a shared machine these imports stretch with the load (the load average above). "
        "Before (issue 45, an idle machine of the same kind): `dprc --help` 6.7 s, the "
        "library's `dprc accountant epsilon` 6.7 s and its argument errors 6.0 s, because "
        "`import dprc_core` imported torch and transformers.",
    ]
    write_page(Path(args.out), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
