"""The API process of an embedded server while a job on a big file starts (issue 45, item 5):
the tokenized store is built by a child process (``worker/ranks.py`` ``build_stores``), so the
server grows by the model and its steps, not by the build.

Two fresh ``dprc serve`` processes (SQLite, the embedded worker on), each given one file of
MiniLM classification lines of about 128 tokens (``benchmarks/data_scale.py``'s lines) through
the official client's chunked upload, then one MiniLM job (exact clipping, full
fine-tuning, batch 64) that is cancelled once its first step is recorded:

* **reference** — a small file (``--small``, default 1,000 lines, below the child-build
  threshold: built in the server's own process, a few MB): the server's growth is the model
  and one step;
* **big** — ``--n`` lines (default 10⁶, ~0.5 GB: its store is built by a child process).

For each: the server's RSS before the create, the create's peak and the RSS after it (its
plan's accounting), then the job's peak above that RSS (``VmHWM``, reset through
``/proc/<pid>/clear_refs`` after the create) and its RSS at the first step, and the seconds to
the first step. Target: the big job's peak growth ≤ the reference's + 32 MiB.

    .venv/bin/python benchmarks/embedded_memory.py [--n 1000000] [--small 1000]
    # writes docs/benchmarks/embedded_memory.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.data_scale import LoadWatch, machine, make_file, measure_upload  # noqa: E402
from benchmarks.kit.memory import proc_memory, reset_peak  # noqa: E402
from benchmarks.kit.pages import PAGES  # noqa: E402
from benchmarks.kit.server import dprc_server  # noqa: E402

OUT = PAGES / "embedded_memory.md"
SLACK_MIB = 32.0


def first_step(lines: int, tmp: Path) -> dict[str, Any]:
    """A fresh embedded server, a file of ``lines`` lines uploaded, one MiniLM job until its
    first step is recorded (then cancelled): the server's memory around it."""
    import openai

    path = tmp / "train.jsonl"
    make_file(path, lines)
    with dprc_server(tmp, default_epsilon=8.0, embedded_worker=True) as server:
        upload = measure_upload(server, path, lines)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0)
        time.sleep(2.0)  # the upload's work settles
        before = proc_memory(server.pid)["VmRSS"]
        reset = reset_peak(server.pid)
        created = time.monotonic()
        job = client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=upload["file_id"],
            hyperparameters={"n_epochs": 1, "batch_size": 64, "max_seq_len": 128},
            extra_body={"privacy": {"target_epsilon": 4.0, "clipping": {"method": "exact"}}},
        )
        create_s = time.monotonic() - created
        # the create's own memory (its plan's accounting) apart from the job's
        after_create = proc_memory(server.pid)
        reset_peak(server.pid)
        started = time.monotonic()
        while True:
            row = client.fine_tuning.jobs.retrieve(job.id)
            extra = row.model_extra or {}
            if (extra.get("steps_done") or 0) >= 1 or row.status in ("failed", "succeeded"):
                break
            time.sleep(0.5)
        seconds = time.monotonic() - started
        at_step = proc_memory(server.pid)
        client.fine_tuning.jobs.cancel(job.id)
        if row.status == "failed":
            raise RuntimeError(f"the job failed: {row.error}")
    return {
        "lines": lines,
        "file_mb": path.stat().st_size / 1e6,
        "upload_s": upload["upload_s"],
        "create_s": create_s,
        "rss_before_mib": before,
        "create_peak_growth_mib": after_create["VmHWM"] - before,
        "rss_after_create_mib": after_create["VmRSS"],
        "peak_growth_mib": at_step["VmHWM"] - after_create["VmRSS"],
        "rss_growth_at_step_mib": at_step["VmRSS"] - after_create["VmRSS"],
        "to_first_step_s": seconds,
        "peak_reset": reset,
    }


def render(result: dict[str, Any]) -> str:
    ref, big = result["reference"], result["big"]
    limit = ref["peak_growth_mib"] + SLACK_MIB
    ok = big["peak_growth_mib"] <= limit
    rows = [
        "| job's file | lines | file (MB) | server RSS before (MiB) | the create: seconds, "
        "peak growth, RSS after (MiB) | seconds to the first step | job's peak growth above "
        "the RSS after the create (MiB) | its RSS growth at the first step (MiB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in (("reference (small)", ref), ("big", big)):
        rows.append(
            f"| {name} | {r['lines']:,} | {r['file_mb']:.1f} | {r['rss_before_mib']:.0f} | "
            f"{r['create_s']:.1f} s, +{r['create_peak_growth_mib']:.0f}, "
            f"{r['rss_after_create_mib']:.0f} | {r['to_first_step_s']:.0f} | "
            f"+{r['peak_growth_mib']:.0f} | +{r['rss_growth_at_step_mib']:.0f} |"
        )
    return "\n".join(
        [
            "# The embedded server's memory while a job on a big file starts (issue 45)\n",
            f"Generated by `{result['command']}` on {result['machine']}, {result['date']}, in "
            f"{result['wall_s'] / 60:.1f} minutes; {result['load']}. Two fresh `dprc serve` "
            "processes (SQLite, embedded worker), each given one file of MiniLM classification "
            "lines of about 128 tokens through the official client's chunked upload, then one "
            "MiniLM job (exact clipping, batch 64), cancelled once its first "
            "step is recorded. The big file's store is built by a child process "
            "(`worker/ranks.py`, `build_stores`: files of 8 MiB or more); the small one's in "
            "the server. Peaks are the server's `VmHWM`, reset before the create and again after "
            "it: the create's own memory (the plan's accounting, which grows with the steps: "
            "issue 45 item 4) is told apart from the job's.\n",
            *rows,
            "",
            f"**{'PASS' if ok else 'FAIL'}: the big job's peak growth is "
            f"+{big['peak_growth_mib']:.0f} MiB; the target is at most the model and one step "
            f"(the reference's +{ref['peak_growth_mib']:.0f} MiB) + {SLACK_MIB:.0f} MiB = "
            f"{limit:.0f} MiB.**",
            "",
            "Before the child build (issue 45's measurement, the store built in the server): "
            "the first MiniLM job on a 200,000-example file grew the server by about 1.0 GB "
            "before its first step.",
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "command": shlex.join(["benchmarks/embedded_memory.py", *sys.argv[1:]]),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    started = time.monotonic()
    with LoadWatch() as load:
        for name, lines in (("reference", args.small), ("big", args.n)):
            with tempfile.TemporaryDirectory(prefix="dprc-embedded-") as tmp:
                result[name] = first_step(lines, Path(tmp))
                print(name, result[name], flush=True)
        result["wall_s"], result["load"] = time.monotonic() - started, load.summary()
    args.out.write_text(render(result))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
