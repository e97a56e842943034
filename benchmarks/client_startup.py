"""Start-up time of the client commands: each run in a fresh process, best of N wall times.

Client commands (``login``, ``files``, ``jobs``, ``audit``, ``accountant … --server``) must not
import torch (tests/dprc/client/test_client_imports.py checks that); the target is under 1 s
each. The commands that reach a server point at a closed port, so what is timed is the start-up
and one refused connection; the library's own ``accountant epsilon`` (torch, the accountant) is
timed beside them for comparison.

    .venv/bin/python benchmarks/client_startup.py [--runs 5]   # docs/benchmarks/client_startup.md
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT  # noqa: E402

DPRC = Path(sys.executable).parent / "dprc"
CLOSED = "http://127.0.0.1:9"
JOB = ["--sigma", "1.1", "--delta", "1e-5", "-q", "0.01", "--steps", "10"]
CLIENT = [
    ["login", "--help"],
    ["files", "list", "--help"],
    ["jobs", "list", "--help"],
    ["audit", "--help"],
    ["files", "list", "--server", CLOSED],
    ["accountant", "epsilon", "--help"],
    ["accountant", "epsilon", *JOB, "--server", CLOSED],
]
LIBRARY = [["accountant", "epsilon", *JOB, "--envelope", "exact"]]
TARGET = 1.0


def best_of(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([str(DPRC), *argv], env=env, capture_output=True, timeout=120)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "client_startup.md"))
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env["DPRC_CLIENT_CONFIG"] = str(Path(os.devnull))
    env["DPRC_API_KEY"] = "dprc-benchmark-key"  # reaches the (refused) connection
    rows = [(a, best_of(a, args.runs, env), True) for a in CLIENT]
    rows += [(a, best_of(a, args.runs, env), False) for a in LIBRARY]
    worst = max(t for _, t, client in rows if client)
    verdict = "PASS" if worst < TARGET else "FAIL"
    lines = [
        "# Client commands: start-up time",
        "",
        f"`benchmarks/client_startup.py --runs {args.runs}`; {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. Best of {args.runs} wall "
        "times, each a fresh process; commands that reach a server point at a closed port, so "
        "their time includes the `openai` SDK's retries of the refused connection, not "
        "start-up alone.",
        "",
        f"**{verdict}: the slowest client command starts in {worst:.2f} s (target < "
        f"{TARGET:.0f} s).**",
        "",
        "| command | kind | best wall time (s) |",
        "|---|---|---|",
    ]
    for argv, t, client in rows:
        kind = "client (no torch)" if client else "library (torch, accountant)"
        lines.append(f"| `dprc {' '.join(argv)}` | {kind} | {t:.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
