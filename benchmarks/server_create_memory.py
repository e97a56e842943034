"""What a real ``dprc serve`` keeps after big job creates (issue 45, part 4: the API's memory
back within +32 MiB of its start after 10⁷-scale creates).

``benchmarks/big_n.py`` uploads 10⁷ lines and creates two jobs on them (exact clipping, one
epoch, batch 1,024: q = 1.024·10⁻⁴, 9,766 steps); this does the same accountant work on a
smaller file: N lines and batch ``round(N · 1024 / 10⁷)`` give the same q and the same number of
steps when N = 1,250,000 and batch 128 (the default). The data set's δ (1/N^1.1) differs, so
the budget check's tail budget does too (by a factor 10 in δ: a few more grid points).

A real ``dprc serve`` (SQLite, ``benchmarks/big_n.py``'s ``big_server``) gets a warm-up upload
and the file, then ``big_n``'s reads and two creates (``reads_and_creates``); the server's
``/proc/<pid>/smaps_rollup`` (Rss, its anonymous and file-backed parts) before them, its peak
during them and after them (and ``--settle`` seconds later).

``--in-process``: the same app over uvicorn in this process (``serve_in_thread``), then what
each of the process's caches holds after the creates and the RSS each release gives back
(diagnosis: the history's block cache, the plans' cache, scipy.fft's plans, malloc_trim).

``PYTHONPATH=$PWD .venv/bin/python benchmarks/server_create_memory.py [--n 1250000]
[--batch 128] [--in-process]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.big_n import big_server, make_file, reads_and_creates
from benchmarks.data_scale import measure_upload, warm_up
from benchmarks.kit.memory import reset_peak, status_kib
from benchmarks.kit.server import Server, admin_key, exact_job_body, serve_in_thread


def smaps(pid: int | str) -> dict[str, float]:
    """Rss, Anonymous and the file-backed rest (MiB) of ``/proc/<pid>/smaps_rollup``."""
    kib: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        kib[name] = int(value.split()[0])
    return {
        "rss_mib": round(kib["Rss"] / 1024, 1),
        "anon_mib": round(kib["Anonymous"] / 1024, 1),
        "file_mib": round((kib["Rss"] - kib["Anonymous"]) / 1024, 1),
    }


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def creates(server: Server, path: Path, n: int, batch: int, settle: float) -> dict[str, Any]:
    """Upload ``path``, then big_n's reads and creates; the server's memory around them."""
    warm_up(server, path.parent)
    up = measure_upload(server, path, n)
    time.sleep(2)
    out: dict[str, Any] = {"upload_s": round(up["upload_s"], 1), "before": smaps(server.pid)}
    out["small_create_s"] = small_create(server)
    out["after_small_create"] = smaps(server.pid)
    reset_peak(server.pid)
    reads = reads_and_creates(server, up["file_id"], batch)
    out["after"] = smaps(server.pid)
    out["peak_mib"] = round(status_kib("VmHWM", server.pid) / 1024, 1)
    time.sleep(settle)
    out["settled"] = smaps(server.pid)
    out["privacy"] = reads["privacy"]
    out["creates_s"] = [
        round(reads[f"POST /v1/fine_tuning/jobs ({k})"]["seconds"], 2) for k in (1, 2)
    ]
    out["history_after_s"] = round(
        reads["GET /v1/files/{id}/budget/history after the jobs"]["median_s"], 3
    )
    b, w = out["before"]["rss_mib"], out["after_small_create"]["rss_mib"]
    out["growth_mib"] = round(out["settled"]["rss_mib"] - b, 1)  # what big_n reports
    out["growth_after_small_create_mib"] = round(out["settled"]["rss_mib"] - w, 1)
    out["peak_growth_mib"] = round(out["peak_mib"] - w, 1)
    return out


def small_create(server: Server) -> float:
    """A job create on a small file of its own (500 lines, batch 20; ``exact_job_body``): what
    any first create loads (the model check's imports), outside the big creates' growth."""
    import httpx

    body = "".join(
        json.dumps({"text": f"small line {i}", "label": i % 2}) + "\n" for i in range(500)
    )
    headers = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=600) as api:
        r = api.post(
            "/v1/files",
            files={"file": ("small.jsonl", body.encode())},
            data={"purpose": "fine-tune"},
        )
        r.raise_for_status()
        start = time.perf_counter()
        r = api.post("/v1/fine_tuning/jobs", json=exact_job_body(r.json()["id"], 1.0))
        r.raise_for_status()
        return round(time.perf_counter() - start, 2)


def in_process(tmp: Path, path: Path, n: int, batch: int) -> dict[str, Any]:
    """The app in this process: the creates, then each cache's size and what releasing it
    gives back."""
    from service.base.settings import Settings

    data_dir = tmp / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(DPRC_DATA_DIR=str(data_dir), DPRC_DEFAULT_EPSILON_BUDGET="8.0")
    key = admin_key(env, "bench")
    settings = Settings(
        data_dir=data_dir,
        default_epsilon_budget=8.0,
        embedded_worker=False,
        inference_engine="off",
    )
    uv, thread, url, _store = serve_in_thread(settings)
    try:
        out = creates(Server(url, key, os.getpid(), data_dir), path, n, batch, 2.0)
        from dprc_core.accounting import history, memory
        from service.budget import planning

        gc.collect()
        rows: list[dict[str, Any]] = []

        def step(name: str, extra: dict[str, Any] | None = None) -> None:
            gc.collect()
            memory.trim_heap()
            rows.append({"step": name, **smaps("self"), **(extra or {})})

        memory.trim_heap()
        rows.append({"step": "after the creates, malloc_trim", **smaps("self")})
        step("after the creates, gc + malloc_trim")
        step(
            "history block cache",
            {"bytes": history._CACHE._bytes, "entries": len(history._CACHE._items)},
        )
        history._CACHE.clear()
        step("history block cache cleared")
        info = planning.library_plan.cache_info()
        planning.library_plan.cache_clear()
        step("library_plan cache cleared", {"entries": info.currsize})
        memory.clear_fft_plans()
        step("fft plans cleared")
        history.clear_cache()
        step("every accountant cache cleared")
        out["release_steps"] = rows
        return out
    finally:
        uv.should_exit = True
        thread.join(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_250_000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--in-process", action="store_true")
    args = ap.parse_args()
    result: dict[str, Any] = {
        "n": args.n,
        "batch": args.batch,
        "load_start": load(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="dprc-create-mem-") as tmp:
        path = Path(tmp) / "big.jsonl"
        make_file(path, args.n)
        if args.in_process:
            result.update(in_process(Path(tmp), path, args.n, args.batch))
        else:
            with big_server(Path(tmp), "sqlite") as (server, _other):
                result.update(creates(server, path, args.n, args.batch, args.settle))
    result["load_end"] = load()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
