"""Big N elsewhere (issue 28, item 4): what grows with the number of examples N, measured at
N = 10⁷ through a real service and the library's samplers.

* **upload** — a file of N short classification lines (``{"text": "x<i> w<j>", "label": 0|1}``,
  a few tokens each, every text distinct) goes to a real ``dprc serve`` (SQLite in a temporary
  ``DPRC_DATA_DIR``, no embedded worker) through the official client's
  ``client.uploads.upload_file_chunked`` in 64 MiB parts: its completion validates every line
  and records every example's keyed hash. Wall time, its phases (parts sent, assembly,
  validation + hashing, recording: ``benchmarks/data_scale.py``'s ``CompletionWatch``), and the
  server's peak RSS above its RSS before (``VmHWM``, reset through ``/proc/<pid>/clear_refs``);
* **reads** — each ``REPEAT`` times, median and slowest: ``GET /v1/files`` (the listing, and
  the dashboard's ``?purpose=fine-tune``), ``GET /v1/files/{id}``, ``GET
  /v1/files/{id}/budget/history``, and the dashboard's data-set pages — signed in by POSTing
  the key to ``/sign-in`` — ``/data-sets`` and ``/data-sets/{id}`` (the HTML, then the JSON its
  script fetches, with the session cookie and the dashboard's header);
* **job creates** — two ``POST /v1/fine_tuning/jobs`` on the file (exact clipping, one epoch,
  batch ``--batch``: the plan calibrates σ for N / batch steps; the budget check composes the
  file's history), then the file and its history read again; the server's peak RSS above its
  RSS before these reads and creates;
* **samplers** — in a fresh process, the library's per-step Poisson sampling at rate
  batch / N (geometric skips, docs/accounting.md §12):
  :class:`~dprc_core.training.sampling.PoissonSampler` (torch's generator) and
  :class:`~dprc_core.training.secure_sampling.SecurePoissonSampler` (ChaCha20 words), and the
  per-user samplers over N examples of N / 10 users at rate batch / users (their index built
  once: "construction"), the mean of ``--draws`` draws and the peak RSS above the RSS before;
  and the per-job cost of :class:`~dprc_core.training.sampling.FixedOrderSampler` (one
  permutation of N). Target (issue 45): a Poisson step ≤ 5 ms;
* **store** (``--store``) — the job's data (``load_job_data``, MiniLM): the tokenized store
  built from the file, then opened again by a later job (its checksums verified), each in a
  fresh process, with the data's peak RSS (``benchmarks/data_scale.py``'s data phase).

The page is written after each phase (a run stopped early leaves what it measured); the
hand-written text between its ``<!-- reading -->`` markers is kept.

    .venv/bin/python benchmarks/big_n.py [--n 10000000] [--batch 1024] [--store] [--out PAGE]
    # writes docs/benchmarks/big_n.md
    .venv/bin/python benchmarks/big_n.py --samplers-only  # reruns the samplers, keeps the rest

The targets of issue 45 are stated on the page with PASS or FAIL: a Poisson step ≤ 5 ms, the
upload ≤ 90 s end to end, the API's RSS back within +32 MiB of its start after the upload and
after the creates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.data_scale import (  # noqa: E402
    READING_END,
    READING_START,
    LoadWatch,
    machine,
    measure_upload,
    upload_phases,
    warm_up,
)
from benchmarks.data_scale import run_child as data_child  # noqa: E402
from benchmarks.kit.memory import proc_memory, reset_peak  # noqa: E402
from benchmarks.kit.server import (  # noqa: E402
    DPRC,
    PG_ADMIN,
    Server,
    admin_key,
    dprc_serve,
    pg_database,
    server_pid,
)
from benchmarks.kit.timing import repeat_timed  # noqa: E402

OUT = ROOT / "docs" / "benchmarks" / "big_n.md"
REPEAT = 5
EPSILON = 1.0  # each job's target; the data set's budget (the tenant's default) is 8


def make_file(path: Path, n: int) -> None:
    """``n`` distinct short classification lines (two words, about 37 bytes each)."""
    with open(path, "w") as f:
        block = []
        for i in range(n):
            block.append(f'{{"text": "x{i} w{(i * 7919) % 1000}", "label": {i % 2}}}\n')
            if len(block) == 65536:
                f.write("".join(block))
                block = []
        f.write("".join(block))


@contextlib.contextmanager
def big_server(tmp: Path, database: str) -> Iterator[tuple[Server, str]]:
    """A real ``dprc serve`` (no embedded worker, data sets budgeted ε 8 by default) on SQLite
    in ``tmp/data``, or on a fresh PostgreSQL database ``dprc_bign_<pid>`` (dropped after);
    the server and an admin key of a second tenant (``other``)."""
    data_dir = tmp / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_DATA_DIR=str(data_dir),
        DPRC_DEFAULT_EPSILON_BUDGET="8.0",
        DPRC_EMBEDDED_WORKER="false",
        DPRC_LOG_LEVEL="warning",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    name = f"dprc_bign_{os.getpid()}"
    if database == "postgresql":
        env["DPRC_DATABASE_URL"] = pg_database(name)

    try:
        bench, other = admin_key(env, "bench"), admin_key(env, "other")
        with dprc_serve(DPRC, env, tmp / "server.log", cwd=ROOT) as url:
            pid = server_pid(int(url.rsplit(":", 1)[1]))
            yield Server(url, bench, pid, data_dir), other
    finally:
        if database == "postgresql":
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


OTHER_LINES = 20  # lines of each small file the other tenant uploads
OTHER_PAUSE_S = 0.05  # between two of its requests


class OtherTenant:
    """Another tenant using the same server while the upload runs, as a client would: in a
    loop, a small upload (``POST /v1/files``, ``OTHER_LINES`` new lines: a write, a budget
    group of its own) and a listing (``GET /v1/files?limit=5``: a read), each timed; a request
    that fails (503 ``store_busy`` after the store's busy timeout, a timeout) is counted."""

    def __init__(self, server: Server, key: str):
        self.server, self.key = server, key
        self.times: dict[str, list[float]] = {"write": [], "read": []}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OtherTenant:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.server.url, headers=headers, timeout=120) as api:
            k = 0
            while not self._stop.is_set():
                k += 1
                body = "".join(
                    json.dumps({"text": f"other {k} {i} {time.time_ns()}", "label": i % 2}) + "\n"
                    for i in range(OTHER_LINES)
                )
                for kind, call in (
                    (
                        "write",
                        lambda b=body: api.post(
                            "/v1/files",
                            files={"file": ("small.jsonl", b.encode())},
                            data={"purpose": "fine-tune"},
                        ),
                    ),
                    ("read", lambda: api.get("/v1/files", params={"limit": 5})),
                ):
                    start = time.perf_counter()
                    try:
                        r = call()
                        ok = r.status_code < 300
                        why = f"{r.status_code} {r.text[:200]}"
                    except httpx.HTTPError as exc:
                        ok, why = False, repr(exc)[:200]
                    self.times[kind].append(time.perf_counter() - start)
                    if not ok:
                        self.errors.append(f"{kind}: {why}")
                    self._stop.wait(OTHER_PAUSE_S)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"errors": len(self.errors), "first_errors": self.errors[:3]}
        for kind, times in self.times.items():
            if times:
                ordered = sorted(times)
                out[kind] = {
                    "count": len(times),
                    "p50_s": ordered[len(ordered) // 2],
                    "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                    "max_s": ordered[-1],
                }
        return out


def measure_upload_with_others(
    server: Server, other_key: str, path: Path, n: int
) -> dict[str, Any]:
    """:func:`measure_upload`, with the other tenant's requests timed before (``BASELINE_S``
    seconds alone) and throughout; the API's RSS once the upload is done and a few seconds
    later (what it keeps)."""
    with OtherTenant(server, other_key) as alone:
        time.sleep(BASELINE_S)
    cpu = _cpu_s(server.pid)
    with OtherTenant(server, other_key) as during:
        up = measure_upload(server, path, n)
    up["api_cpu_s"] = _cpu_s(server.pid) - cpu
    up["others_alone"], up["others"] = alone.summary(), during.summary()
    time.sleep(SETTLE_S)
    up["api_rss_settled_mib"] = proc_memory(server.pid)["VmRSS"]
    return up


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process and of its children it waited for (the hashing workers):
    ``utime + stime + cutime + cstime`` of ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


BASELINE_S = 10.0  # the other tenant alone, before the upload
SETTLE_S = 5.0  # after the upload, before the RSS it keeps is read


def _timed(call: Callable[[], Any], repeat: int = REPEAT) -> dict[str, float]:
    """Median and slowest of ``repeat`` calls (seconds)."""
    times = repeat_timed(call, repeat)
    return {"median_s": statistics.median(times), "max_s": max(times), "repeat": repeat}


def reads_and_creates(server: Server, file_id: str, batch: int) -> dict[str, Any]:
    """The listing, the file, its history, the dashboard's pages and two job creates."""
    import httpx

    out: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=3600) as api:

        def get(path: str) -> Callable[[], Any]:
            def call() -> Any:
                r = api.get(path)
                r.raise_for_status()
                return r.json()

            return call

        listing = get("/v1/files")()
        out["listed"] = len(listing["data"])
        out["GET /v1/files"] = _timed(get("/v1/files"))
        out["GET /v1/files?purpose=fine-tune"] = _timed(get("/v1/files?purpose=fine-tune"))
        out["GET /v1/files/{id}"] = _timed(get(f"/v1/files/{file_id}"))
        out["GET /v1/files/{id}/budget/history"] = _timed(
            get(f"/v1/files/{file_id}/budget/history")
        )
        with httpx.Client(base_url=server.url, timeout=3600) as browser:
            signed = browser.post("/sign-in", data={"api_key": server.key})
            if signed.status_code not in (200, 303) or not browser.cookies.get("dprc_session"):
                raise RuntimeError(f"sign-in failed: {signed.status_code} {signed.text[:300]}")
            dash = {"X-DPRC-Dashboard": "1", "Accept": "application/json"}

            def page(path: str, *fetches: str) -> Callable[[], None]:
                def call() -> None:
                    r = browser.get(path)
                    r.raise_for_status()
                    for api_path in fetches:  # what the page's script fetches
                        browser.get(api_path, headers=dash).raise_for_status()

                return call

            out["dashboard /data-sets (HTML + its JSON)"] = _timed(
                page("/data-sets", "/v1/files?purpose=fine-tune")
            )
            out["dashboard /data-sets/{id} (HTML only)"] = _timed(page(f"/data-sets/{file_id}"))
            out["dashboard /data-sets/{id} (HTML + its JSON)"] = _timed(
                page(
                    f"/data-sets/{file_id}",
                    f"/v1/files/{file_id}",
                    f"/v1/files/{file_id}/budget/history",
                )
            )
        body = {
            "model": "minilm-l6-v2",
            "training_file": file_id,
            "hyperparameters": {"n_epochs": 1, "batch_size": batch},
            "privacy": {"target_epsilon": EPSILON, "clipping": {"method": "exact"}},
        }
        for k in (1, 2):
            start = time.perf_counter()
            r = api.post("/v1/fine_tuning/jobs", json=body)
            seconds = time.perf_counter() - start
            if r.status_code >= 300:
                raise RuntimeError(f"job create failed: {r.status_code} {r.text[:500]}")
            job = r.json()
            out[f"POST /v1/fine_tuning/jobs ({k})"] = {"seconds": seconds, "id": job["id"]}
            out["privacy"] = {
                key: job["privacy"].get(key)
                for key in ("noise_multiplier", "sample_rate", "steps", "target_epsilon", "delta")
            }
        out["GET /v1/files/{id} after the jobs"] = _timed(get(f"/v1/files/{file_id}"))
        out["GET /v1/files/{id}/budget/history after the jobs"] = _timed(
            get(f"/v1/files/{file_id}/budget/history")
        )
    return out


def sampling(n: str, batch: str, draws: str) -> dict[str, Any]:
    """The samplers at N = ``n``, rate batch / N: mean seconds a draw and the peak RSS above
    the RSS before (MiB), each sampler after a reset of the peak."""
    import torch

    from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler
    from dprc_core.training.secure_sampling import SecurePoissonSampler
    from dprc_core.training.user_sampling import (
        SecureUserPoissonSampler,
        UserIndex,
        UserPoissonSampler,
    )

    size, b, k = int(n), int(batch), int(draws)
    q = b / size
    pid = os.getpid()
    out: dict[str, Any] = {"threads": torch.get_num_threads()}

    def measure(name: str, make: Callable[[], Any]) -> None:
        base = proc_memory(pid)["VmRSS"]
        reset_peak(pid)
        start = time.perf_counter()
        sampler = make()
        built = time.perf_counter() - start
        sizes, times = [], []
        start = time.perf_counter()
        for batch_indices in sampler:  # each draw timed as the training loop meets it
            times.append(time.perf_counter() - start)
            sizes.append(len(batch_indices))
            if len(times) == k:
                break
            start = time.perf_counter()
        out[name] = {
            "construct_s": built,
            "first_draw_s": times[0],
            "mean_draw_s": statistics.mean(times[1:] or times),
            "draws": len(times),
            "mean_batch": statistics.mean(sizes),
            "peak_above_mib": proc_memory(pid)["VmHWM"] - base,
        }

    measure("PoissonSampler", lambda: PoissonSampler(size, q, steps=k, seed=0))
    measure("SecurePoissonSampler", lambda: SecurePoissonSampler(size, q, steps=k))
    measure("FixedOrderSampler", lambda: FixedOrderSampler(size, b, epochs=1, seed=0))
    users = max(1, size // 10)  # N examples of N / 10 users, 10 each
    qu = min(1.0, b / users)
    measure(
        "UserPoissonSampler",
        lambda: UserPoissonSampler(UserIndex.of(torch.arange(size) % users), qu, k, 8, seed=0),
    )
    measure(
        "SecureUserPoissonSampler",
        lambda: SecureUserPoissonSampler(UserIndex.of(torch.arange(size) % users), qu, k, 8),
    )
    return out


def run_child(*args: str) -> dict[str, Any]:
    """Run ``--child KIND ARGS`` of this script in a fresh process; its JSON answer."""
    return data_child(*args, script=__file__)


def _size(path: Path) -> float:
    """MB of a file, or of a folder's files."""
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


READS = [
    "GET /v1/files",
    "GET /v1/files?purpose=fine-tune",
    "GET /v1/files/{id}",
    "GET /v1/files/{id}/budget/history",
    "dashboard /data-sets (HTML + its JSON)",
    "dashboard /data-sets/{id} (HTML only)",
    "dashboard /data-sets/{id} (HTML + its JSON)",
    "POST /v1/fine_tuning/jobs (1)",
    "POST /v1/fine_tuning/jobs (2)",
    "GET /v1/files/{id} after the jobs",
    "GET /v1/files/{id}/budget/history after the jobs",
]


def _read_rank(name: str) -> int:
    """A read's row on the page: the order :func:`reads_and_creates` makes them in (the kept
    JSON sorts its keys)."""
    return READS.index(name) if name in READS else len(READS)


SAMPLERS = [
    "PoissonSampler",
    "SecurePoissonSampler",
    "UserPoissonSampler",
    "SecureUserPoissonSampler",
    "FixedOrderSampler",
]
POISSON_STEP_TARGET_S = 0.005  # a Poisson step at N = 10⁷, B = 1024 (issue 45)
UPLOAD_TARGET_S = 90.0  # a 10⁷-example upload, end to end
OTHERS_P99_TARGET_S = 1.0  # the other tenant's requests during the upload: "unblocked"
UPLOAD_KEYS = {"sqlite": "upload", "postgresql": "upload_postgresql"}


def _database_mb(server: Server, db: str) -> float:
    """The database's size after the upload (MB): SQLite's file and its log, or
    ``pg_database_size``."""
    if db == "sqlite":
        database = server.data_dir / "dprc.sqlite3"
        return sum(
            _size(p) for p in (database, database.with_name(database.name + "-wal")) if p.exists()
        )
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(%s)", (f"dprc_bign_{os.getpid()}",)).fetchone()
    return float(row[0]) / 1e6 if row else 0.0


RSS_TARGET_MIB = 32.0  # the API's RSS after the upload / the creates, above its start


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(result: dict[str, Any]) -> list[str]:
    """The targets of issue 45 this page measures, each with PASS or FAIL and its date."""
    rows = ["| target | measured | verdict | when |", "| --- | --- | --- | --- |"]
    s, when = result.get("sampling"), result.get("dates", {})
    for name in SAMPLERS[:4]:
        if s and name in s:
            v = s[name]["mean_draw_s"]
            rows.append(
                f"| `{name}` step ≤ {POISSON_STEP_TARGET_S * 1e3:.0f} ms | {v * 1e3:.2f} ms | "
                f"{_verdict(v <= POISSON_STEP_TARGET_S)} | {when.get('sampling', result['date'])} |"
            )
    up = result.get("upload")
    for db, key in UPLOAD_KEYS.items():
        u = result.get(key)
        if u is None:
            continue
        at = when.get(key, when.get("service", result["date"]))
        total = u["upload_s"]
        rows.append(
            f"| upload of {result['n']:,} ≤ {UPLOAD_TARGET_S:.0f} s ({db}) | {total:.1f} s | "
            f"{_verdict(total <= UPLOAD_TARGET_S)} | {at} |"
        )
        others = u.get("others")
        if others is not None:
            p99 = max(others[k]["p99_s"] for k in ("write", "read") if k in others)
            ok = p99 <= OTHERS_P99_TARGET_S and others["errors"] == 0
            rows.append(
                f"| another tenant's requests during it: p99 ≤ {OTHERS_P99_TARGET_S:.0f} s, none "
                f"failed ({db}) | p99 {p99:.3f} s, {others['errors']} failed | {_verdict(ok)} "
                f"| {at} |"
            )
        kept = u.get("api_rss_settled_mib", u["api_rss_after_mib"])
        grown = kept - u["api_rss_before_mib"]
        rows.append(
            f"| API RSS after the upload ≤ start + {RSS_TARGET_MIB:.0f} MiB ({db}) | "
            f"{grown:+.0f} MiB | {_verdict(grown <= RSS_TARGET_MIB)} | {at} |"
        )
    if result.get("reads") is not None and up is not None:
        grown = result["api_rss_after_reads_mib"] - up["api_rss_before_mib"]
        rows.append(
            f"| API RSS after the creates ≤ start + {RSS_TARGET_MIB:.0f} MiB | +{grown:.0f} MiB"
            f" | {_verdict(grown <= RSS_TARGET_MIB)} | {when.get('service', result['date'])} |"
        )
    return rows


def render(result: dict[str, Any]) -> str:
    """The page (a phase the run did not reach is said to be missing)."""
    n = result["n"]
    lines = [
        f"# Big N: what grows with the number of examples, at N = {n:,} (issue 28)\n",
        f"Generated by `{result['command']}` on {result['machine']}, {result['date']}, in "
        f"{result['wall_s'] / 60:.1f} minutes"
        + ("" if result.get("finished") else " (stopped before its end: partial)")
        + f"; {result['load']}. A real `dprc serve` (no embedded worker, a fresh data "
        "folder) on SQLite, or on a fresh PostgreSQL database where a row says so, and the "
        "library's samplers in a fresh process; each phase's date is in its table. The file: "
        f"{n:,} distinct lines such as "
        '`{"text": "x12 w28", "label": 0}`, '
        f"{result.get('file_mb', 0):.0f} MB.\n",
    ]
    lines += ["## Targets (issue 45)\n", *targets(result), ""]
    missing = "Not measured: the run stopped before this phase.\n"
    lines += ["## Upload (validation of every line, a keyed hash of every example)\n"]
    uploads = [(db, result[key]) for db, key in UPLOAD_KEYS.items() if key in result]
    if not uploads:
        lines.append(missing)
    else:
        lines += [
            "Through the official client's `client.uploads.upload_file_chunked`, 64 MiB parts, "
            "after a warm-up upload. Phases as in [data.md](data.md): parts sent, assembly, "
            "validation + hashing (by worker processes for a big file, hashes sorted in runs "
            "and merged), recording of the hashes in the database (in transactions of "
            "10,000 rows, on SQLite each followed by a pause a quarter as long; on "
            "PostgreSQL no pause, two connections at once, and since migration 0017 no "
            "foreign keys: docs/data.md). CPU: the seconds the API and its hashing workers "
            "used during the upload, the other tenant's requests included (on an idle "
            "machine the wall time of the hashing is about "
            "its share over the cores). The API's RSS after: when the upload answered, and "
            f"{SETTLE_S:.0f} s later.\n",
            "| database | upload: total (s), and its phases | CPU (s) | API RSS before (MiB) | "
            "API peak RSS above it (MiB) | API RSS after (MiB) | database after (MB) | when, "
            "load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for db, u in uploads:
            settled = u.get("api_rss_settled_mib")
            after = f"{u['api_rss_after_mib']:.0f}" + (
                f", {settled:.0f}" if settled is not None else ""
            )
            size = u.get("database_mb", result.get("database_mb", 0.0))
            at = result.get("dates", {}).get(UPLOAD_KEYS[db], result["date"])
            lines.append(
                f"| {db} | {upload_phases(u)} | {_f(u.get('api_cpu_s'))} | "
                f"{u['api_rss_before_mib']:.0f} | "
                f"+{u['api_peak_growth_mib']:.1f} | {after} | {size:.0f} | "
                f"{at}; {u.get('load', result['load'])} |"
            )
        lines.append("")
        measured = [(db, u) for db, u in uploads if "others" in u]
        if measured:
            lines += [
                "Another tenant (`other`) meanwhile, in a loop with "
                f"{OTHER_PAUSE_S * 1e3:.0f} ms pauses: a write (`POST /v1/files`, "
                f"{OTHER_LINES} new lines: a budget group of its own) and a read (`GET "
                f"/v1/files?limit=5`); first {BASELINE_S:.0f} s alone (the same server, idle), "
                "then throughout the upload. Unblocked means: p99 ≤ "
                f"{OTHERS_P99_TARGET_S:.0f} s and no request failed.\n",
                "| database | when | request | count | p50 (s) | p99 (s) | max (s) | failed |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for db, u in measured:
                for label, o in (("alone", u.get("others_alone")), ("during", u["others"])):
                    if o is None:
                        continue
                    for kind in ("write", "read"):
                        if kind in o:
                            v = o[kind]
                            lines.append(
                                f"| {db} | {label} | {kind} | {v['count']} | {v['p50_s']:.3f} | "
                                f"{v['p99_s']:.3f} | {v['max_s']:.3f} | {o['errors']} |"
                            )
            lines.append("")
    lines += ["## Reads, the dashboard's pages and job creates\n"]
    reads = result.get("reads")
    if reads is None:
        lines.append(missing)
    else:
        lines += [
            f"Each read {REPEAT} times (the median and the slowest); `GET /v1/files` lists "
            f"{reads['listed']} files (the data set and the warm-up). The dashboard's pages "
            "after a sign-in (`POST /sign-in` with the key): the HTML, then the JSON its script "
            f"fetches. The creates: exact clipping, one epoch, batch {result['batch']}, target ε "
            f"{EPSILON} each on a budget of ε 8: σ {reads['privacy']['noise_multiplier']:.3f}, "
            f"q {reads['privacy']['sample_rate']:.3g}, {reads['privacy']['steps']:,} steps.\n",
            "| request | median (s) | slowest (s) |",
            "| --- | --- | --- |",
        ]
        for name, value in sorted(reads.items(), key=lambda item: _read_rank(item[0])):
            if isinstance(value, dict) and "median_s" in value:
                lines.append(f"| {name} | {value['median_s']:.3f} | {value['max_s']:.3f} |")
            elif isinstance(value, dict) and "seconds" in value:
                lines.append(f"| {name} | {value['seconds']:.2f} (once) | |")
        lines += [
            "",
            "The server's RSS before these reads and creates: "
            f"{result['api_rss_before_reads_mib']:.0f} MiB; its peak during them: "
            f"+{result['api_peak_growth_reads_mib']:.1f} MiB; after: "
            f"{result['api_rss_after_reads_mib']:.0f} MiB.\n",
        ]
    lines += ["## Samplers\n"]
    s = result.get("sampling")
    if s is None:
        lines.append(missing)
    else:
        when = result.get("dates", {}).get("sampling", result["date"])
        if when != result["date"]:
            lines.append(
                f"Rerun alone (`benchmarks/big_n.py --samplers-only`) on {when}; "
                f"{result.get('sampling_load', '')}.\n"
            )
        lines += [
            f"Rate q = {result['batch']} / {n:,}, {s['threads']} torch threads; the mean of the "
            "draws after the first, and the peak RSS above the RSS before (per sampler, after a "
            "reset of the peak).\n",
            "| sampler | construction (s) | first draw (s) | mean draw (s) | draws | mean batch "
            "| peak RSS above before (MiB) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name in SAMPLERS:
            if name not in s:
                continue
            v = s[name]
            lines.append(
                f"| `{name}` | {v['construct_s']:.3f} | {v['first_draw_s']:.3f} | "
                f"{v['mean_draw_s']:.3f} | {v['draws']} | {v['mean_batch']:.0f} | "
                f"{v['peak_above_mib']:.0f} |"
            )
        lines.append("")
    if "store_build" in result:
        build, reuse = result["store_build"], result["store_reuse"]
        lines += [
            "",
            "## The job's data: the tokenized store\n",
            "`load_job_data` of a MiniLM classification job (`max_seq_len` 128) in a fresh "
            "process, then again in another (the store reused: opened and its checksums "
            "verified), each followed by 20 Poisson batches at rate 64 / N "
            "(`benchmarks/data_scale.py`'s data phase); the peak RSS above the RSS with the "
            "model and tokenizer loaded.\n",
            "| | store ready (s) | peak RSS above model + tokenizer (MiB) |",
            "| --- | --- | --- |",
            f"| first job: built | {build['store_ready']:.1f} | "
            f"{build['peak_rss_mib'] - build['base_rss_mib']:.0f} |",
            f"| later job: reused | {reuse['store_ready']:.1f} | "
            f"{reuse['peak_rss_mib'] - reuse['base_rss_mib']:.0f} |",
            "",
            f"The store on disk: {result['store_mb']:.0f} MB.",
        ]
    if result.get("reading"):
        lines += ["", result["reading"]]
    kept = {k: v for k, v in result.items() if k != "reading"}
    lines += ["", f"<!-- big_n: {json.dumps(kept, sort_keys=True)} -->", ""]
    return "\n".join(lines)


def _kept(page: Path) -> dict[str, Any]:
    """The results a page keeps in its ``<!-- big_n: … -->`` comment."""
    marker = "<!-- big_n: "
    text = page.read_text() if page.exists() else ""
    at = text.find(marker)
    if at < 0:
        raise SystemExit(f"{page} holds no earlier results: run without --samplers-only")
    return json.loads(text[at + len(marker) : text.index(" -->", at)])


def samplers_only(args: argparse.Namespace, fresh: dict[str, Any]) -> int:
    """Rerun the samplers' phase; the page's other phases stay as measured (with their date)."""
    result = _kept(args.out)
    if (result["n"], result["batch"]) != (args.n, args.batch):
        raise SystemExit("--samplers-only needs the page's --n and --batch")
    dates = result.setdefault("dates", {})
    dates.setdefault("service", result["date"])
    with LoadWatch() as load:
        result["sampling"] = run_child("sampling", str(args.n), str(args.batch), str(args.draws))
        dates["sampling"] = fresh["date"]
        result["sampling_load"] = load.summary()
    result["reading"] = fresh.get("reading", "")
    args.out.write_text(render(result))
    print(args.out.read_text())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--store",
        action="store_true",
        help="also build the tokenized store of the file (MiniLM) and open it again",
    )
    ap.add_argument(
        "--samplers-only",
        action="store_true",
        help="rerun only the samplers; the page keeps its other phases (dated)",
    )
    ap.add_argument(
        "--database",
        choices=sorted(UPLOAD_KEYS),
        default="sqlite",
        help="the server's database: SQLite in the run's folder, or a fresh PostgreSQL "
        "database dprc_bign_<pid> (dropped after; DPRC_TEST_PG_ADMIN names the server)",
    )
    ap.add_argument(
        "--upload-only",
        action="store_true",
        help="only the upload (and, on SQLite, the reads and creates unless --no-reads); the "
        "page keeps its other phases (dated)",
    )
    ap.add_argument("--no-reads", action="store_true", help="skip the reads and job creates")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        assert kind == "sampling"
        print(json.dumps(sampling(*rest)), flush=True)
        return 0
    result: dict[str, Any] = {
        "n": args.n,
        "batch": args.batch,
        "command": shlex.join(["benchmarks/big_n.py", *sys.argv[1:]]),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.out.exists():  # the hand-written reading of the page is kept
        text = args.out.read_text()
        a, b = text.find(READING_START), text.find(READING_END)
        if 0 <= a < b:
            result["reading"] = text[a : b + len(READING_END)]
    if args.samplers_only:
        return samplers_only(args, result)
    if args.upload_only:  # the page's other phases are kept, with their dates
        kept = _kept(args.out)
        if kept["n"] != args.n:
            raise SystemExit("--upload-only needs the page's --n")
        kept.update({k: result[k] for k in ("command", "machine", "date") if k in result})
        kept["reading"] = result.get("reading", "")
        result = kept
    else:
        result["dates"] = {"sampling": result["date"]}
    dates = result.setdefault("dates", {})
    db = args.database
    started = time.monotonic()
    with LoadWatch() as load, tempfile.TemporaryDirectory(prefix="dprc-big-n-") as tmp:

        def save() -> None:  # after each phase: a run stopped early leaves what it measured
            result["wall_s"], result["load"] = time.monotonic() - started, load.summary()
            args.out.write_text(render(result))

        if not args.upload_only:
            result["sampling"] = run_child(
                "sampling", str(args.n), str(args.batch), str(args.draws)
            )
            print("sampling", result["sampling"], flush=True)
        path = Path(tmp) / "big.jsonl"
        t = time.monotonic()
        make_file(path, args.n)
        result["file_mb"] = path.stat().st_size / 1e6
        print(f"file: {result['file_mb']:.0f} MB in {time.monotonic() - t:.0f} s", flush=True)
        with big_server(Path(tmp), db) as (server, other_key):
            warm_up(server, Path(tmp))
            with LoadWatch(every=5.0) as upload_load:
                up = measure_upload_with_others(server, other_key, path, args.n)
            up["load"] = upload_load.summary()
            up["database_mb"] = _database_mb(server, db)
            result[UPLOAD_KEYS[db]] = up
            dates[UPLOAD_KEYS[db]] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            print("upload", up, flush=True)
            save()
            if db == "sqlite" and not args.no_reads:
                before = proc_memory(server.pid)["VmRSS"]
                reset_peak(server.pid)
                result["reads"] = reads_and_creates(server, up["file_id"], args.batch)
                after = proc_memory(server.pid)
                result["api_rss_before_reads_mib"] = before
                result["api_peak_growth_reads_mib"] = after["VmHWM"] - before
                result["api_rss_after_reads_mib"] = after["VmRSS"]
                dates["service"] = dates[UPLOAD_KEYS[db]]
                print("reads", result["reads"], flush=True)
                save()
        if args.store:  # the job's data: the store built, then opened again (a later job)
            store = str(Path(tmp) / "store")
            for name in ("store_build", "store_reuse"):
                result[name] = data_child("data", str(path), store, tmp)
                print(name, result[name], flush=True)
            result["store_mb"] = _size(Path(store))
            dates["store"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            result["store_load"] = load.summary()
        result["finished"] = True
        save()
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
