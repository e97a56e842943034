"""The vLLM section of scripts/gpu_check.sh: dprc's router (service.inference.relay) against a
real vLLM OpenAI-compatible server on a lent GPU.

It builds a small Llama locally (byte tokenizer, dprc's default chat template, head size 64)
and a PEFT LoRA adapter on it, starts ``vllm serve``-equivalent
``python -m vllm.entrypoints.openai.api_server`` with ``--enable-lora`` and runtime LoRA
updates, and relays through :class:`service.inference.relay.Relay` (settings ``vllm_url`` /
``vllm_model``, the embedded engine off): the base model and the adapter (registered by the
relay with ``POST /v1/load_lora_adapter``), chat and text completions, streamed and not, and
8 concurrent requests' tokens/s. It prints ``summary:`` lines (gpu_check.sh copies them into
summary.txt) and exits non-zero when a check fails. Without vLLM installed it says so and
exits 0 (the section is skipped)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NAME = "dprc-vllm-check"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(folder: Path) -> tuple[Path, Path]:
    import torch
    from peft import LoraConfig, get_peft_model

    from dprc_core.training.chat_template import DEFAULT_CHAT_TEMPLATE
    from dprc_core.training.models import load_model, load_tokenizer
    from dprc_core.training.tiny import build_tiny_llama

    base = build_tiny_llama(
        folder / "base", hidden=256, layers=2, max_positions=1024, tokenizer="byte"
    )
    tok = load_tokenizer(base)
    tok.chat_template = DEFAULT_CHAT_TEMPLATE
    tok.save_pretrained(base)
    model = load_model(base, "causal_lm")
    lora = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    torch.manual_seed(1)
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    lora.save_pretrained(folder / "adapter", safe_serialization=True)
    return base, folder / "adapter"


async def _checks(url: str, token: str, base: Path, adapter: Path) -> list[str]:
    from service.base.settings import Settings
    from service.inference.relay import Relay, Reply, Stream
    from service.inference.targets import ServedModel

    settings = Settings(
        vllm_url=url,
        vllm_model=NAME,
        vllm_api_key=token,
        inference_engine="off",
        data_dir=Path(tempfile.mkdtemp()),
    )
    relay = Relay(settings)
    out, failures = [], []
    served = {
        "base": ServedModel(NAME, base),
        "lora": ServedModel("ft:dprc-vllm-check:t::ftjob-check", adapter, base, NAME),
    }
    texts = {}
    for kind, model in served.items():
        body = {
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        reply = await relay.send("/v1/chat/completions", body, model)
        assert isinstance(reply, Reply)
        texts[kind] = reply.body["choices"][0]["message"]["content"]
        usage = reply.body.get("usage", {})
        stream = await relay.send("/v1/chat/completions", {**body, "stream": True}, model)
        assert isinstance(stream, Stream)
        raw = b"".join([c async for c in stream.chunks])
        await stream.close()
        if b"[DONE]" not in raw:
            failures.append(f"{kind}: the stream did not end with [DONE]")
        out.append(f"{kind}: {usage.get('completion_tokens')} tokens, answer {texts[kind]!r}")
    if texts["base"] == texts["lora"]:
        failures.append("the adapter's answer equals the base's: was it applied?")
    t0 = time.perf_counter()
    bodies = [{"prompt": f"abc {i}", "max_tokens": 64, "temperature": 0} for i in range(8)]
    replies = await asyncio.gather(
        *(relay.send("/v1/completions", b, served["lora"]) for b in bodies)
    )
    wall = time.perf_counter() - t0
    tokens = sum(r.body["usage"]["completion_tokens"] for r in replies if isinstance(r, Reply))
    out.append(
        f"8 concurrent LoRA completions: {tokens} tokens in {wall:.2f} s "
        f"({tokens / wall:.0f} tokens/s)"
    )
    await relay.aclose()
    return [f"summary: vllm {line}" for line in out] + [f"summary: vllm FAIL {f}" for f in failures]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=240, help="seconds for vLLM to start")
    args = ap.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("summary: vllm skipped (vllm is not installed on this machine)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base, adapter = _build(Path(tmp))
        port, token = _free_port(), "check-" + os.urandom(8).hex()
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_API_KEY": token,
            "HF_HUB_OFFLINE": "1",
        }
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(base),
            "--served-model-name",
            NAME,
            "--enable-lora",
            "--max-lora-rank",
            "8",
            "--max-model-len",
            "1024",
            "--gpu-memory-utilization",
            "0.3",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        proc = subprocess.Popen(argv, env=env)
        try:
            import httpx

            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + args.timeout
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    print("summary: vllm FAIL the server did not start")
                    return 1
                time.sleep(1)
            lines = asyncio.run(_checks(url, token, base, adapter))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("\n".join(lines))
    return 1 if any(" FAIL " in line for line in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
