"""The engine as the dprc API meets it: ``python -m inference`` in a subprocess on a free
port (one per test module), tiny byte-level Llamas built locally, references computed with
transformers' own ``generate`` in the test process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "inference-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Engine:
    url: str
    token: str
    proc: subprocess.Popen
    log: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def post(self, path: str, body: object, **kw) -> httpx.Response:
        kw.setdefault("timeout", 60)
        return httpx.post(self.url + path, json=body, headers=self.headers(), **kw)

    def stats(self) -> dict:
        return httpx.get(self.url + "/stats", headers=self.headers(), timeout=10).json()

    def register(self, name: str, path: Path, base: Path | None = None) -> None:
        body = {"lora_name": name, "lora_path": str(path)}
        if base is not None:
            body["base_model_path"] = str(base)
        r = self.post("/v1/load_lora_adapter", body)
        assert r.status_code == 200, r.text

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.token, max_retries=0)


@contextmanager
def running_engine(tmp: Path, *args: str) -> Iterator[Engine]:
    port = free_port()
    log = tmp / f"engine-{port}.log"
    env = {**os.environ, "DPRC_INFERENCE_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inference", "--host", "127.0.0.1", "--port", str(port), *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the engine exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield Engine(url, TOKEN, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def byte_llama(tmp_path_factory) -> Path:
    """A tiny random Llama with the byte-level tokenizer (256 positions)."""
    from dprc_core.training.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("inference") / "a", tokenizer="byte")


@pytest.fixture(scope="session")
def byte_llama_b(tmp_path_factory) -> Path:
    """Another one, other weights, same size."""
    from dprc_core.training.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("inference") / "b", tokenizer="byte", seed=1)


def reference_model(path: Path, adapter: Path | None = None):
    """The model as transformers loads it, for ``generate`` references."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True).eval()
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).eval()
    return model, AutoTokenizer.from_pretrained(path)


def greedy_reference(model, ids: list[int], k: int) -> list[int]:
    """``model.generate(do_sample=False)``'s new tokens for the prompt ``ids`` alone."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=k,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="session")
def engine(tmp_path_factory, byte_llama) -> Iterator[Engine]:
    """One engine (default limits, token set) with ``tiny`` registered, shared by the modules
    that need no special settings."""
    with running_engine(tmp_path_factory.mktemp("engine"), "--max-new-tokens-limit", "512") as e:
        e.register("tiny", byte_llama)
        yield e
