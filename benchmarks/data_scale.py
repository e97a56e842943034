"""Data sets at scale (issue 28): uploads through the Uploads API, the tokenized store's build
and reuse against the tokenizer's own throughput, and the worker's memory, at N = 10k, 100k and
1M examples of 128 tokens.

Per N, in fresh processes (so that the peaks are the configuration's own):

* **upload** — a real ``dprc serve`` (SQLite in a temporary ``DPRC_DATA_DIR``, no embedded
  worker) takes the file from the official client's ``client.uploads.upload_file_chunked`` in
  64 MiB parts: the wall time (split into the parts sent and the completion, whose assembly,
  line-by-line validation and hashing, and recording of the examples' hashes are told apart by
  watching the upload's folder), and the server's peak RSS above its RSS before the upload
  (``VmHWM`` of ``/proc/<pid>/status``, reset with ``/proc/<pid>/clear_refs``, as
  ``tests/api/test_upload_memory.py`` reads it);
* **tokenizer alone** — ``tokenizer(texts, truncation=True, max_length=128)`` over the same
  texts in batches of 1024, texts already in memory: the throughput to compare with;
* **data** — the job's data alone (``load_job_data``: the store built, then 20 Poisson batches
  sliced): the store's build time and the data's peak RSS above the model and tokenizer
  (``--no-data-phase`` skips it, one build less: the build time is then the first job's, up
  to its last progress line, and the data's own peak is not measured — the job's peak does
  not bound it, its baseline holds the freed model's memory);
* **first job** — ``run_job`` of a one-step MiniLM classification job (the worker's code path:
  model, store build, plan, one DP step, the final checkpoint): the time to the first step's
  end, and the peak RSS above the RSS after the model is loaded (``VmHWM`` reset with
  ``/proc/self/clear_refs``), against the issue's bound of 64 MB + 8 bytes a token;
* **second job** on the same file: time to the first step's end (the store is reused).

The file's lines are ``{"text", "label"}`` with texts of about 128 MiniLM tokens.

The page keeps its rows (as JSON in an HTML comment at its end) and each row says which run
produced its upload figures and which its store and job figures, so that a run of some Ns or
of some columns (``--only-upload``, ``--no-upload``) is merged into the earlier ones; each run
is listed with its date, command, machine, load average and wall time. The hand-written text
between the ``<!-- reading -->`` markers is kept.

    .venv/bin/python benchmarks/data_scale.py [--n 10000 100000 1000000]
        [--only-upload | --no-upload] [--no-data-phase] [--out docs/benchmarks/data.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.kit.memory import proc_memory, reset_peak, status_kib  # noqa: E402
from benchmarks.kit.pages import PAGES  # noqa: E402
from benchmarks.kit.server import Server, dprc_server  # noqa: E402

OUT = PAGES / "data.md"
WORDS = "the of and a to in is was he for it with as his on be at by i this had not are but".split()
MiB = 1024**2
PART_BYTES = 64 * MiB  # the official client's default part size, and the service's largest
ROWS_MARK = "<!-- data_scale rows: "
READING_START, READING_END = "<!-- reading -->", "<!-- /reading -->"


def _rss_mib(field: str = "VmRSS") -> float:
    return status_kib(field) / 1024


def make_file(path: Path, n: int) -> None:
    """n lines of about 128 MiniLM tokens each (126 words plus [CLS] and [SEP])."""
    with open(path, "w") as f:
        for i in range(n):
            words = [WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(126)]
            f.write(json.dumps({"text": f"{i} " + " ".join(words), "label": i % 2}) + "\n")


def tokenizer_alone(path: str) -> dict:
    from transformers import AutoTokenizer

    from benchmarks.kit.peers import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    with open(path, "rb") as f:
        texts = [json.loads(line)["text"] for line in f]
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 1024):
        ids = tok(texts[i : i + 1024], truncation=True, max_length=128)["input_ids"]
        tokens += sum(len(x) for x in ids)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "examples": len(texts)}


def one_job(path: str, store: str, out: str) -> dict:
    import torch

    from benchmarks.kit.peers import minilm_path
    from dprc_core.training.runner import JobSpec, run_job

    torch.set_num_threads(os.cpu_count() or 1)
    n = sum(1 for _ in open(path, "rb"))
    spec = JobSpec(
        model=str(minilm_path()),
        task="classification",
        train_file=path,
        output_dir=out,
        epochs=64 / n,  # one step at expected batch 64
        batch_size=64,
        learning_rate=1e-3,
        max_seq_len=128,
        target_epsilon=8.0,
        norm_method="exact",
        train_only=["classifier"],
        seed=0,
        token_store=store,
    )
    # the model's RSS first: the same loading the job does, then dropped
    from dprc_core.training.models import load_model

    model = load_model(Path(spec.model), "classification", num_labels=2)
    del model
    base = _rss_mib()
    reset = reset_peak()
    marks: dict[str, float] = {}
    start = time.perf_counter()

    def on_event(message: str) -> None:
        if message.startswith("Tokenized") and "of" in message:
            marks["built"] = time.perf_counter() - start
        if message.startswith("Reusing"):
            marks["opened"] = time.perf_counter() - start

    result = run_job(spec, on_event=on_event, resume=False)
    total = time.perf_counter() - start
    return {
        "steps": result.steps,
        "to_first_step_end": total,
        "store_ready": marks.get("built", marks.get("opened")),
        "reused": "opened" in marks,
        "base_rss_mib": base,
        "peak_rss_mib": _rss_mib("VmHWM"),
        "peak_reset": reset,
    }


def data_phase(path: str, store: str, out: str) -> dict:
    """The job's data alone: the store built (or opened) and 20 Poisson-size batches sliced,
    peak RSS above the RSS with the model and tokenizer loaded."""
    import torch

    from benchmarks.kit.peers import minilm_path
    from dprc_core.training.models import load_model
    from dprc_core.training.runner import JobSpec, load_job_data

    n = sum(1 for _ in open(path, "rb"))
    spec = JobSpec(
        model=str(minilm_path()),
        task="classification",
        train_file=path,
        output_dir=out,
        max_seq_len=128,
        token_store=store,
    )
    model = load_model(Path(spec.model), "classification", num_labels=2)
    from dprc_core.training.models import load_tokenizer

    load_tokenizer(spec.model)
    base = _rss_mib()
    reset = reset_peak()
    start = time.perf_counter()
    data = load_job_data(spec)
    ready = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        index = torch.nonzero(torch.rand(n, generator=generator) < 64 / n).flatten()
        data.train.batch(index)
    del model
    return {
        "store_ready": ready,
        "base_rss_mib": base,
        "peak_rss_mib": _rss_mib("VmHWM"),
        "peak_reset": reset,
    }


# -- a real ``dprc serve`` and an upload through it --------------------------------------------


class CompletionWatch:
    """Watches an upload's folder while its completion runs (``files/<tenant>/uploads/<id>/``):
    when the ``assembled`` file reaches the upload's size (the parts concatenated and their MD5
    taken), and when it leaves the folder (validated and hashed line by line, the hashes sorted
    and merged: the file is moved into place and the hashes are recorded in the database)."""

    def __init__(self, data_dir: Path, size: int, start: float, every: float = 0.2):
        self.data_dir, self.size, self.start, self.every = data_dir, size, start, every
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CompletionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seen: Path | None = None
        while not self._stop.is_set():
            t = time.monotonic() - self.start
            if seen is None:
                found = list(self.data_dir.glob("files/*/uploads/*/assembled"))
                if found:
                    seen = found[0]
                    self.marks.setdefault("assembling", t)
            if seen is not None:
                try:
                    if seen.stat().st_size >= self.size:
                        self.marks.setdefault("assembled", t)
                except FileNotFoundError:
                    self.marks.setdefault("assembled", t)
                    self.marks.setdefault("hashed", t)
                    return
            self._stop.wait(self.every)


def warm_up(server: Server, tmp: Path) -> None:
    """A small upload first, so that the code paths are loaded before the measured one (its
    texts share no example with the measured file: that one gets a budget group of its own)."""
    import openai

    small = tmp / "warm-up.jsonl"
    small.write_text(
        "".join(
            json.dumps({"text": f"warm-up line {i}", "label": i % 2}) + "\n" for i in range(500)
        )
    )
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0)
    client.uploads.upload_file_chunked(
        file=small, mime_type="text/jsonl", purpose="fine-tune", part_size=16 * 1024
    )


def measure_upload(server: Server, path: Path, n: int) -> dict[str, Any]:
    """Upload ``path`` (``n`` lines) with ``upload_file_chunked`` in 64 MiB parts; its wall
    time and phases, and the server's RSS before, peak during and after (MiB)."""
    import openai

    client = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=server.key, max_retries=0, timeout=4 * 3600
    )
    uploads = client.uploads
    complete = uploads.complete
    marks: dict[str, float] = {}
    size = path.stat().st_size

    def timed_complete(*args: Any, **kwargs: Any) -> Any:
        marks["parts_sent"] = time.monotonic() - started
        return complete(*args, **kwargs)

    # upload_file_chunked calls self.complete(...): the instance attribute marks the moment
    # the last part is in
    uploads.complete = timed_complete  # type: ignore[method-assign]
    before = proc_memory(server.pid)["VmRSS"]
    reset = reset_peak(server.pid)
    started = time.monotonic()
    with CompletionWatch(server.data_dir, size, started) as watch:
        done = uploads.upload_file_chunked(
            file=path, mime_type="text/jsonl", purpose="fine-tune", part_size=PART_BYTES
        )
        seconds = time.monotonic() - started
    after = proc_memory(server.pid)
    if done.status != "completed" or done.file is None:
        raise RuntimeError(f"upload not completed: {done}")
    extra = done.file.model_extra or {}
    if extra.get("n_examples") != n:
        raise RuntimeError(f"the file holds {extra.get('n_examples')} examples, not {n}")
    phases = {**watch.marks, **marks}
    return {
        "file_id": done.file.id,
        "upload_s": seconds,
        "parts_s": phases.get("parts_sent"),
        "assembled_s": phases.get("assembled"),
        "hashed_s": phases.get("hashed"),
        "api_rss_before_mib": before,
        "api_peak_mib": after["VmHWM"],
        "api_peak_growth_mib": after["VmHWM"] - before,
        "api_rss_after_mib": after["VmRSS"],
        "peak_reset": reset,
    }


def upload_phases(u: dict[str, Any]) -> str:
    """ "total (parts p, assembly a, validation + hashing h, recording r)" in seconds, the
    phases that were observed."""
    parts, assembled, hashed, total = u["parts_s"], u["assembled_s"], u["hashed_s"], u["upload_s"]
    if parts is None or assembled is None or hashed is None:
        return f"{total:.1f}"
    return (
        f"{total:.1f} (parts {parts:.1f}, assembly {assembled - parts:.1f}, validation + "
        f"hashing {hashed - assembled:.1f}, recording {total - hashed:.1f})"
    )


def upload_child(path: str, n: str) -> dict[str, Any]:
    """The upload of ``path`` (``n`` lines) through a fresh server in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="dprc-upload-") as tmp, dprc_server(Path(tmp)) as s:
        warm_up(s, Path(tmp))
        return measure_upload(s, Path(path), int(n))


class LoadWatch:
    """The 1-minute load average every ``every`` seconds while a run goes on (``uptime``'s
    first figure): its value at the start, and its least and greatest."""

    def __init__(self, every: float = 10.0):
        self.every = every
        self.start = os.getloadavg()
        self.values: list[float] = [self.start[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.values.append(os.getloadavg()[0])

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(os.getloadavg()[0])

    def summary(self) -> str:
        one, five, fifteen = self.start
        return (
            f"load average at the start {one:.2f}, {five:.2f}, {fifteen:.2f}; 1-minute load "
            f"{min(self.values):.1f}–{max(self.values):.1f} during the run "
            f"({len(self.values)} readings)"
        )


def machine() -> str:
    """The host's name and cores, as the pages name the machine."""
    return f"{platform.node() or 'this machine'} ({os.cpu_count()} cores)"


def run_child(*args: str, script: str = __file__) -> dict[str, Any]:
    """Run one measurement (``script --child KIND ARGS``, this script by default) in a fresh
    process; its JSON answer (the last line it prints)."""
    out = subprocess.run(
        [sys.executable, script, "--child", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# -- the page ---------------------------------------------------------------------------------


def load_page(path: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], str]:
    """The rows (by N) and runs kept at the end of the page, and its hand-written reading
    (markers included); empty when the page or its rows are absent."""
    if not path.exists():
        return {}, [], ""
    text = path.read_text()
    rows: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    start = text.find(ROWS_MARK)
    if start >= 0:
        end = text.index(" -->", start)
        kept = json.loads(text[start + len(ROWS_MARK) : end])
        rows, runs = kept["rows"], kept["runs"]
    a, b = text.find(READING_START), text.find(READING_END)
    reading = text[a : b + len(READING_END)] if 0 <= a < b else ""
    return rows, runs, reading


def _f(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def render(rows: dict[str, dict[str, Any]], runs: list[dict[str, Any]], reading: str) -> str:
    """The page: the upload table, the store and job table, the runs, the reading, the rows."""
    label = {run["id"]: chr(ord("A") + i) for i, run in enumerate(runs)}
    ordered = sorted(rows.values(), key=lambda r: r["n"])
    upload_head = (
        "| N | file (MB) | upload: total (s), and its phases | API RSS before (MiB) "
        "| API peak RSS above it (MiB) | API RSS after (MiB) | run |\n" + "|" + " --- |" * 7 + "\n"
    )
    upload_body = ""
    for r in ordered:
        u = r.get("upload")
        if u is None:
            upload_body += (
                f"| {r['n']:,} | {_f(r.get('file_mb'), '.0f')} | not measured |" + " — |" * 4 + "\n"
            )
            continue
        upload_body += (
            f"| {r['n']:,} | {r['file_mb']:.0f} | {upload_phases(u)} | "
            f"{u['api_rss_before_mib']:.0f} | +{u['api_peak_growth_mib']:.1f} | "
            f"{u['api_rss_after_mib']:.0f} | {label.get(r.get('upload_run', ''), '?')} |\n"
        )
    job_head = (
        "| N | tokens | tokenizer alone (s) | store build (s) | build / tokenizer "
        "| data's peak RSS above model + tokenizer (MiB) | bound 64 MB + 8 B/token (MiB) "
        "| first job: to first step end (s) | second job (s), store reused "
        "| job's peak RSS above the model: first / second (MiB) | store on disk (MB) | run |\n"
        + "|"
        + " --- |" * 12
        + "\n"
    )
    job_body = ""
    for r in ordered:
        j = r.get("jobs")
        tokens = r.get("tokens")
        if j is None:
            job_body += f"| {r['n']:,} | not measured |" + " — |" * 10 + "\n"
            continue
        tok_s, build_s = j.get("tokenizer_s"), j.get("build_s")
        ratio = f"{build_s / tok_s:.2f}×" if tok_s and build_s else "—"
        build = _f(build_s) + (" (in the first job)" if j.get("build_in_job") else "")
        second = _f(j.get("second_s"))
        if j.get("second_s") is not None and not j.get("second_reused", True):
            second += " (rebuilt!)"
        job_body += (
            f"| {r['n']:,} | {_f(tokens, ',.0f')} | {_f(tok_s)} | {build} | {ratio} | "
            f"{_f(j.get('data_rss_above_model_mib'), '.0f')} | "
            f"{_f(64 + 8 * tokens / 2**20 if tokens else None, '.0f')} | "
            f"{_f(j.get('first_s'))} | {second} | "
            f"{_f(j.get('job_rss_above_model_mib'), '.0f')} / "
            f"{_f(j.get('second_rss_above_model_mib'), '.0f')} | "
            f"{_f(j.get('store_mb'), '.0f')} | {label.get(r.get('jobs_run', ''), '?')} |\n"
        )
    run_lines = "".join(
        f"- **{label[run['id']]}** — {run['id']}, {run['machine']}: `{run['command']}`; "
        f"{run['load']}; "
        + (
            f"wall time {run['wall_s'] / 60:.1f} min"
            if run.get("wall_s") is not None
            else "wall time not recorded"
        )
        + ("" if run.get("finished", True) else " (stopped before its end: partial)")
        + (f". {run['note']}" if run.get("note") else "")
        + "\n"
        for run in runs
    )
    kept = json.dumps({"rows": rows, "runs": runs}, sort_keys=True)
    return (
        "# Data sets at scale\n\n"
        "Generated by `benchmarks/data_scale.py` (issue 28): MiniLM's fast tokenizer, examples "
        "of about 128 tokens, `max_seq_len` 128. Each figure names the run that produced it "
        "(the runs are listed below with their date, command, machine and load).\n\n"
        "## Uploads\n\n"
        "A real `dprc serve` (SQLite, no embedded worker, a fresh data folder per N) takes the "
        "file from the official client's `client.uploads.upload_file_chunked` in 64 MiB parts, "
        "after a small warm-up upload. The phases: the parts sent; their assembly into one file "
        "(with its MD5); the completion's line-by-line validation and keyed hashing of every "
        "example (the hashes sorted in runs and merged on disk); the recording of the hashes in "
        "the database and the file's row (told apart by watching the upload's folder, to "
        "0.2 s). The API's peak RSS is `VmHWM` of the server process, reset just before the "
        "upload, minus its `VmRSS` then (the bound of issue 28: +64 MB).\n\n"
        + upload_head
        + upload_body
        + "\n## Tokenized store and jobs\n\n"
        "A one-step job (the worker's `run_job`: model, store, plan, one DP step, final "
        "checkpoint). The store build includes hashing the file, validating every line and the "
        "checksums. The data's peak is the store's build and opening plus 20 Poisson batches "
        "sliced from it (the bound of issue 28); the job's peak adds the engine, the optimizer "
        "and one step's activations (B = 64, T = 128), which do not grow with N. A build "
        "marked *in the first job* is timed from that job's start to its last progress line "
        "(its run skipped the data phase, `--no-data-phase`, and did not measure the data's "
        "own peak).\n\n"
        + job_head
        + job_body
        + "\n## Runs\n\n"
        + run_lines
        + ("\n" + reading + "\n" if reading else "")
        + f"\n{ROWS_MARK}{kept} -->\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    only = ap.add_mutually_exclusive_group()
    only.add_argument(
        "--only-upload", action="store_true", help="measure the upload only; keep the job figures"
    )
    only.add_argument(
        "--no-upload", action="store_true", help="measure the store and jobs; keep the uploads'"
    )
    ap.add_argument(
        "--no-data-phase",
        action="store_true",
        help="skip the data phase (one build less): the store's build time is read from the "
        "first job's progress lines and the data's own peak is not measured",
    )
    ap.add_argument("--out", type=Path, default=OUT, help="the page (its rows are merged)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        children: dict[str, Callable[..., dict[str, Any]]] = {
            "tokenizer": tokenizer_alone,
            "data": data_phase,
            "job": one_job,
            "upload": upload_child,
        }
        print(json.dumps(children[kind](*rest)), flush=True)
        return 0
    rows, runs, reading = load_page(args.out)
    command = shlex.join(["benchmarks/data_scale.py", *sys.argv[1:]])
    run = {
        "id": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "command": command,
        "load": "",
        "wall_s": 0.0,
        "finished": False,
    }
    runs.append(run)
    started = time.monotonic()
    with LoadWatch() as load:

        def save() -> None:
            run["load"], run["wall_s"] = load.summary(), time.monotonic() - started
            args.out.write_text(render(rows, runs, reading))

        for n in args.n:
            row = rows.setdefault(str(n), {"n": n})
            with tempfile.TemporaryDirectory(prefix="dprc-data-") as tmp:
                path = Path(tmp) / "train.jsonl"
                make_file(path, n)
                row["file_mb"] = path.stat().st_size / 1e6
                if not args.no_upload:
                    row["upload"], row["upload_run"] = (
                        run_child("upload", str(path), str(n)),
                        run["id"],
                    )
                    print(n, "upload", row["upload"], flush=True)
                    save()
                if args.only_upload:
                    continue
                jobs: dict[str, Any] = {}
                row["jobs"], row["jobs_run"] = jobs, run["id"]
                alone = run_child("tokenizer", str(path))
                row["tokens"], jobs["tokenizer_s"] = alone["tokens"], alone["seconds"]
                save()
                if not args.no_data_phase:
                    data = run_child("data", str(path), str(Path(tmp) / "data-store"), tmp)
                    jobs["build_s"] = data["store_ready"]
                    jobs["data_rss_above_model_mib"] = data["peak_rss_mib"] - data["base_rss_mib"]
                    save()
                store = str(Path(tmp) / "store")
                first = run_child("job", str(path), store, str(Path(tmp) / "out1"))
                jobs["first_s"] = first["to_first_step_end"]
                jobs["job_rss_above_model_mib"] = first["peak_rss_mib"] - first["base_rss_mib"]
                if args.no_data_phase:  # the build's end: the first job's last progress line
                    jobs["build_s"], jobs["build_in_job"] = first["store_ready"], True
                save()
                second = run_child("job", str(path), store, str(Path(tmp) / "out2"))
                jobs["second_s"], jobs["second_reused"] = (
                    second["to_first_step_end"],
                    second["reused"],
                )
                jobs["second_rss_above_model_mib"] = second["peak_rss_mib"] - second["base_rss_mib"]
                jobs["store_mb"] = (
                    sum(p.stat().st_size for p in Path(store).rglob("*") if p.is_file()) / 1e6
                )
                print(n, "jobs", jobs, flush=True)
                save()
        run["finished"] = True
    save()
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
