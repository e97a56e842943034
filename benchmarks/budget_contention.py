"""Budgeted job creation under contention (issue 16 item 2): 30 concurrent creates, each with
its own target ε, on one budgeted file that already has 0, 20 or 100 older jobs (ended after
running some steps, so its history is that many distinct privacy events), on SQLite and on
PostgreSQL, through HTTP (uvicorn) as clients send them.

Reports p50 / p99 latency of the creates, how many were accepted (200), refused for the
budget (409), refused otherwise, answered 5xx, or timed out (60 s), and checks that the
file's committed ε — recomputed here with the accountant from the accepted jobs' and the
older jobs' events — is within the budget.

Run: ``.venv/bin/python benchmarks/budget_contention.py [--older 0 20 100] [--db sqlite
postgresql]``; results go to docs/benchmarks/budget.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import httpx

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.kit.server import (  # noqa: E402
    exact_job_body,
    exact_job_event,
    pg_database,
    serve_in_thread,
)
from dprc_core.accounting import (  # noqa: E402
    PrivacyEvent,
    SubsampledGaussianEvent,
    epsilon_for_events,
)
from service.base.settings import Settings  # noqa: E402
from service.jobs import job_runs  # noqa: E402

CLIENTS = 30
BUDGET = 8.0


def _lines(n: int, prefix: str = "t") -> bytes:
    return "".join(
        json.dumps({"text": f"{prefix}{i}", "label": i % 2}) + "\n" for i in range(n)
    ).encode()


def _body(file_id: str, epsilon: float, method: str) -> dict:
    """A create body: the one-epoch MiniLM job of the budget tests, with exact norms or
    randomized (hutch, k = 32, the per-example sketch that randomized clipping defaults to)."""
    body = exact_job_body(file_id, epsilon)
    if method != "exact":
        body["privacy"]["clipping"] = {"method": method, "k": 32}
    return body


def _event(job: dict) -> PrivacyEvent:
    """The privacy event a created job was charged, from its privacy object."""
    p = job["privacy"]
    a = p["accountant"]
    return SubsampledGaussianEvent(
        p["noise_multiplier"],
        p["sample_rate"],
        p["steps"],
        a["clipping"],
        a["k"],
        None,
        a["sketch"],
    )


def run(db: str, older: int, method: str = "exact") -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="dprc-bench-"))
    url = pg_database(f"dprc_bench_{older}") if db == "postgresql" else None
    settings = Settings(
        data_dir=tmp,
        database_url=url,
        embedded_worker=False,
        max_active_jobs_per_tenant=1000,
        require_budget=False,
    )  # type: ignore[call-arg]
    server, thread, base, store = serve_in_thread(settings)
    try:
        from service.governance.keys import create_key

        with store.sessions() as session:
            key = create_key(session, "bench", "admin")[1]  # uploads with budgets and jobs
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=300) as http:
            # warm-up, as on a server that has run before: the model's files and checks are
            # loaded once, on a file without a budget
            warm = http.post(
                "/v1/files",
                files={"file": ("w.jsonl", _lines(400, "w"))},
                data={"purpose": "fine-tune"},
            ).json()
            http.post(
                "/v1/fine_tuning/jobs", json=exact_job_body(warm["id"], 1.0)
            ).raise_for_status()
            f = http.post(
                "/v1/files",
                files={"file": ("d.jsonl", _lines(400))},
                data={"purpose": "fine-tune", "epsilon_budget": str(BUDGET)},
            ).json()
            delta = f["budget"]["delta"]
            history: list[PrivacyEvent] = []
            t0 = time.perf_counter()
            for i in range(older):  # ended jobs that ran i % 20 + 1 of their steps
                job = http.post(
                    "/v1/fine_tuning/jobs", json=exact_job_body(f["id"], 0.05 + 0.001 * i)
                )
                job.raise_for_status()
                jid, j = job.json()["id"], job.json()
                steps = i % j["privacy"]["steps"] + 1
                assert job_runs.start_job(store, jid, "bench-worker")
                job_runs.record_progress(store, jid, steps, 0.0)
                job_runs.end_job(store, jid, "cancelled")
                e = exact_job_event(j)
                history.append(PrivacyEvent(e.noise_multiplier, e.sample_rate, steps))
            setup = time.perf_counter() - t0

        # the clients exist before the burst: building one (its TLS context) costs tens of
        # milliseconds of CPU, which in this process would compete with the server for the GIL
        # and be counted in its latency; a real client builds it in its own process
        clients = [httpx.Client(base_url=base, headers=headers, timeout=60) for _ in range(CLIENTS)]

        def create(i: int) -> tuple[float, int | str, dict | None]:
            start = time.perf_counter()
            try:
                c = clients[i]
                r = c.post("/v1/fine_tuning/jobs", json=_body(f["id"], 2.0 + 0.05 * i, method))
                return (
                    time.perf_counter() - start,
                    r.status_code,
                    (r.json() if r.status_code == 200 else None),
                )
            except httpx.TimeoutException:
                return time.perf_counter() - start, "timeout", None

        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(create, range(CLIENTS)))
        for c in clients:
            c.close()
        lat = sorted(r[0] for r in results)
        codes = [r[1] for r in results]
        accepted = [r[2] for r in results if r[2] is not None]
        composed = epsilon_for_events(history + [_event(j) for j in accepted], delta)
        with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
            committed = http.get(f"/v1/files/{f['id']}").json()["budget"]["committed"]
        return {
            "db": db,
            "older": older,
            "method": method,
            "setup_s": setup,
            "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "accepted": codes.count(200),
            "refused_budget": codes.count(409),
            "other_4xx": sum(
                1 for c in codes if isinstance(c, int) and 400 <= c < 500 and c != 409
            ),
            "5xx": sum(1 for c in codes if isinstance(c, int) and c >= 500),
            "timeouts": codes.count("timeout"),
            "composed": composed,
            "committed": committed,
            "within_budget": committed <= BUDGET,
        }
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--older", type=int, nargs="+", default=[0, 20, 100])
    ap.add_argument("--db", nargs="+", default=["sqlite", "postgresql"])
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "budget.md"))
    ap.add_argument("--method", nargs="+", default=["exact", "hutch"])
    ap.add_argument("--one", nargs=3, metavar=("DB", "OLDER", "METHOD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # one configuration, in a process of its own (no cache carried over)
        print(json.dumps(run(args.one[0], int(args.one[1]), args.one[2])), flush=True)
        return 0
    rows = []
    for db, older, method in itertools.product(args.db, args.older, args.method):
        if True:
            out = subprocess.run(
                [sys.executable, __file__, "--one", db, str(older), method],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(row, flush=True)
            rows.append(row)
    head = (
        "| database | older jobs | norm method | p50 create (s) | p99 create (s) | accepted "
        "| refused (budget) "
        "| other 4xx | 5xx | time-outs (60 s) | file's committed ε (budget 8) "
        "| full composition of its events |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    body = "".join(
        f"| {r['db']} | {r['older']} | {r['method']} | {r['p50']:.2f} | {r['p99']:.2f} | "
        f"{r['accepted']} | "
        f"{r['refused_budget']} | {r['other_4xx']} | {r['5xx']} | {r['timeouts']} | "
        f"{r['committed']:.3f}{'' if r['within_budget'] else ' OVER'} | {r['composed']:.3f} |\n"
        for r in rows
    )
    text = (
        "# Budgeted job creation under contention\n\n"
        f"Generated by `benchmarks/budget_contention.py` on this machine ({os.cpu_count()} "
        f"cores): {CLIENTS} concurrent creates, each with its own target ε (2.0 + 0.05·i), on one "
        "file with a budget of ε = 8 that already holds the given number of ended jobs "
        "(distinct privacy events). Each configuration runs in a fresh process whose server has "
        "made one job before (on another file, so the model's files are loaded). The "
        "composition is incremental (dprc_core/accounting/history.py) and runs outside the "
        "write lock on a snapshot checked under it (service/budget/budget.py).\n\n" + head + body
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
