"""The embedded generation engine (``python -m inference``) against plain ``model.generate``.

A random Llama built locally (hidden 256, 4 layers, byte tokenizer), fixed prompts, greedy
decoding of ``--tokens`` new tokens each. The baseline is ``model.generate`` on the same model
and prompts in this process, one prompt after the other. The engine runs as its own process
(``--max-batch 32``) and is driven by 1, 8 and 32 concurrent streaming clients; per request it
measures the time to the first streamed token and the whole request's latency, overall the
output tokens per second (completion tokens / wall time). Then the engine's RSS with 1 and 3
models cached (copies of the same size, other seeds).

    .venv/bin/python benchmarks/inference.py [--tokens 48] [--quick]  # docs/benchmarks/inference.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.memory import MIB, proc_memory  # noqa: E402
from benchmarks.kit.pages import PAGES, ROOT, cpu_model, git_commit, write_page  # noqa: E402
from benchmarks.kit.timing import timed  # noqa: E402

TOKEN = "inference-benchmark"
TARGET = 0.9  # the engine's tokens/s at least this share of plain generate's
PROMPTS = [
    f"Request {i}: summarise the quarterly report on " + "regional sales and margins " * (1 + i % 4)
    for i in range(32)
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(folder: Path, seed: int) -> Path:
    from dprc_core.training.tiny import build_tiny_llama

    return build_tiny_llama(
        folder / f"llama-{seed}",
        hidden=256,
        layers=4,
        max_positions=512,
        seed=seed,
        tokenizer="byte",
    )


def plain_generate(path: Path, prompts: list[str], tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(path)
    latencies, produced = [], 0
    with torch.no_grad():
        ids = tok(prompts[0], return_tensors="pt").input_ids
        model.generate(ids, do_sample=False, max_new_tokens=4)  # warm-up
        t0 = time.perf_counter()
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            mask = torch.ones_like(ids)
            dt, out = timed(
                lambda ids=ids, mask=mask: model.generate(
                    ids, attention_mask=mask, do_sample=False, max_new_tokens=tokens
                )
            )
            latencies.append(dt)
            produced += out.shape[1] - ids.shape[1]
        wall = time.perf_counter() - t0
    return {"tokens": produced, "wall": wall, "latencies": latencies, "ttft": []}


class Engine:
    def __init__(self, tmp: Path, args: list[str]):
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "DPRC_INFERENCE_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
        self.log = open(tmp / "engine.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inference", "--port", str(self.port), *args],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.http.get(self.url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the engine did not start")

    def register(self, name: str, path: Path) -> None:
        body = {"lora_name": name, "lora_path": str(path)}
        self.http.post(self.url + "/v1/load_lora_adapter", json=body).raise_for_status()

    def stream(self, model: str, prompt: str, tokens: int) -> tuple[float, float, int]:
        """(time to first token, latency, completion tokens) of one streamed completion."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        first, used = None, 0
        with self.http.stream("POST", self.url + "/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    first = time.perf_counter() - t0
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
        return (
            (first if first is not None else time.perf_counter() - t0),
            (time.perf_counter() - t0),
            used,
        )

    def drive(self, model: str, prompts: list[str], clients: int, tokens: int) -> dict:
        todo = list(enumerate(prompts))
        lock = threading.Lock()
        ttft, lat, produced = [], [], [0]

        def client() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    _, prompt = todo.pop(0)
                a, b, n = self.stream(model, prompt, tokens)
                with lock:
                    ttft.append(a)
                    lat.append(b)
                    produced[0] += n

        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {
            "tokens": produced[0],
            "wall": time.perf_counter() - t0,
            "latencies": lat,
            "ttft": ttft,
        }

    def rss_mib(self) -> float:
        return proc_memory(self.proc.pid)["VmRSS"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--out", default=str(PAGES / "inference.md"))
    args = ap.parse_args()
    # the same OpenMP policy as the engine's process (set before torch is imported here): on a
    # shared machine, spinning idle workers slow plain generate several times over
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dprc-inference-bench-") as tmp_name:
        tmp = Path(tmp_name)
        paths = [build(tmp, seed) for seed in (0, 1, 2)]
        model_mib = sum(p.stat().st_size for p in paths[0].glob("*.safetensors")) / MIB
        per = {1: 4, 8: 16, 32: 32} if args.quick else {1: 8, 8: 32, 32: 64}
        base_prompts = PROMPTS[: 4 if args.quick else 12]
        plain = plain_generate(paths[0], base_prompts, args.tokens)
        print(f"plain generate: {plain['tokens'] / plain['wall']:.1f} tokens/s")
        engine = Engine(tmp, ["--max-batch", "32", "--max-queue", "64"])
        try:
            rss0 = engine.rss_mib()
            engine.register("m0", paths[0])
            engine.drive("m0", PROMPTS[:2], 1, 4)  # load and warm up
            rows = {}
            for clients, count in per.items():
                prompts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
                rows[clients] = engine.drive("m0", prompts, clients, args.tokens)
                r = rows[clients]
                print(f"engine, {clients} clients: {r['tokens'] / r['wall']:.1f} tokens/s")
            rss1 = engine.rss_mib()
            for i, path in enumerate(paths[1:], start=1):
                engine.register(f"m{i}", path)
                engine.drive(f"m{i}", PROMPTS[:1], 1, 4)
            cached = engine.http.get(engine.url + "/stats").json()["cached_models"]
            rss3 = engine.rss_mib()
        finally:
            engine.close()
    base_tps = plain["tokens"] / plain["wall"]
    lines = [
        "# The embedded generation engine: throughput, latency, memory",
        "",
        f"`benchmarks/inference.py --tokens {args.tokens}{' --quick' if args.quick else ''}`; "
        f"{cpu_model()}, {os.cpu_count()} cores (load average {load0:.1f} at the start: a "
        f"shared machine), Python {platform.python_version()}, commit {git_commit()}.",
        "",
        f"Model: a random Llama built locally (hidden 256, 4 layers, byte tokenizer, "
        f"{model_mib:.1f} MiB of float32 weights); greedy, {args.tokens} new tokens a request "
        "(fewer where the end token comes first), fixed prompts of 60 to 140 tokens. Baseline: "
        f"`model.generate(do_sample=False)` in the benchmark's process, {len(base_prompts)} "
        "prompts one after the other. Engine: `python -m inference --max-batch 32 --max-queue "
        "64` in its own process, streaming completions over HTTP from N client threads; tokens/s "
        "= completion tokens / wall time of the whole run; time to first token = until the "
        "first streamed text. torch's thread count is its default and `OMP_WAIT_POLICY=PASSIVE` in "
        "both processes (the engine sets it, docs/inference_engine.md; without it plain "
        "generate ran about 7× slower here, its idle OpenMP workers spinning on a loaded "
        "machine).",
        "",
        "| run | requests | output tokens/s | × plain generate | TTFT p50 (s) | TTFT p99 (s) "
        "| latency p50 (s) | latency p99 (s) |",
        "|---|---|---|---|---|---|---|---|",
        f"| plain `generate`, sequential | {len(base_prompts)} | {base_tps:.1f} | 1.00 | – | – "
        f"| {pct(plain['latencies'], 0.5):.2f} | {pct(plain['latencies'], 0.99):.2f} |",
    ]
    for clients, r in rows.items():
        tps = r["tokens"] / r["wall"]
        lines.append(
            f"| engine, {clients} concurrent client{'s' if clients > 1 else ''} "
            f"| {len(r['latencies'])} | {tps:.1f} | {tps / base_tps:.2f} "
            f"| {pct(r['ttft'], 0.5):.3f} | {pct(r['ttft'], 0.99):.3f} "
            f"| {pct(r['latencies'], 0.5):.2f} | {pct(r['latencies'], 0.99):.2f} |"
        )
    one = rows[1]["tokens"] / rows[1]["wall"] / base_tps
    verdict = (
        "PASS"
        if min(rows[c]["tokens"] / rows[c]["wall"] / base_tps for c in rows) >= TARGET
        else "FAIL"
    )
    lines += [
        "",
        f"**{verdict}: the engine's tokens/s is at least {TARGET}× plain generate's at every "
        f"concurrency** (1 client: {one:.2f}×).",
        "",
        "| engine process | RSS (MiB) |",
        "|---|---|",
        f"| started, no model loaded | {rss0:.0f} |",
        f"| 1 model cached (after the runs above) | {rss1:.0f} |",
        f"| 3 models cached ({', '.join(cached)}) | {rss3:.0f} |",
        "",
        f"Each further model of this size adds about {(rss3 - rss1) / 2:.0f} MiB "
        f"({model_mib:.1f} MiB of weights); the rest is Python, torch and transformers.",
        f"p50 and p99 are over {statistics.fmean([len(r['latencies']) for r in rows.values()]):.0f}"
        " requests on average a run: with few requests p99 is close to the maximum.",
    ]
    write_page(Path(args.out), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
