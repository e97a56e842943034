"""Cost of secure mode: ChaCha20 sum-of-normals noise vs torch's generator, per training step.

Model: a Llama built locally from a config (hidden 768, 12 layers, 12 heads, intermediate 2304,
vocab 32768, tied embeddings: ~117M parameters), float32, CPU, ``torch.set_num_threads(1)``.
Step: ``PrivacyEngine(norm_method="exact")``, plain SGD, one logical batch of B = 2 random
sequences of length T = 32. Two cases: full fine-tuning (noise for every parameter) and LoRA
(r = 8 on q, k, v, o; noise for the adapters only).

For each case three engines on the same model run interleaved, one warm-up step each, then
``--steps`` measured steps each:

* ``torch``: today's ``GaussianNoise`` (``torch.randn`` from the engine's generator);
* ``secure sync``: ``SecureGaussianNoise(prefetch=False)``: the noise is generated inside
  ``engine.step()``;
* ``secure prefetch``: ``SecureGaussianNoise(prefetch=True)`` after ``expect(params)``. In the
  interleaved rounds the benchmark waits, after each of its steps, for the background thread to
  finish the next step's noise before the other configurations run: the step it then times is
  the step with its noise ready (as with a spare core that generated it meanwhile).
* ``prefetch overlapped``: afterwards the same engine runs ``--steps`` consecutive steps, the
  background thread generating step t + 1's noise while step t + 1 computes its gradients on
  the same machine: the mean step time, and ``waited`` = what the training thread still waited
  for the noise (``waited_s``). This is the cost on the critical path when the generator shares
  the machine with the training (here: 2 cores, other jobs running).

Every configuration has its own copy of the model (same weights).

Also the raw throughput of each generator (normals per second, one thread) and the time to
generate one step's noise for all trainable parameters.

Usage::

    .venv/bin/python benchmarks/secure_noise.py          # writes docs/benchmarks/secure_noise.md
    .venv/bin/python benchmarks/secure_noise.py --quick  # small model, 1 step, prints only
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from datetime import UTC, datetime
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

from benchmarks.kit.pages import ROOT  # noqa: E402
from dprc_core import PrivacyEngine  # noqa: E402
from dprc_core.clipping import Clipping, Exact  # noqa: E402
from dprc_core.losses import causal_lm_per_sample_loss  # noqa: E402
from dprc_core.noise import Gaussian, SecureGaussianNoise, SecureStream  # noqa: E402

FULL = dict(hidden=768, layers=12, heads=12, intermediate=2304, vocab=32768)
QUICK = dict(hidden=256, layers=4, heads=8, intermediate=688, vocab=4096)
B, T = 2, 32
CONFIGS = ("torch", "secure sync", "secure prefetch")


def build_model(size: dict[str, int], lora: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    model: torch.nn.Module = LlamaForCausalLM(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        )
        model = get_peft_model(model, cfg)
    model.train()
    return model


def make_engine(model: torch.nn.Module, config: str) -> tuple[PrivacyEngine, Any]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(
            model,
            opt,
            clipping=Clipping(1.0, Exact(), check_independence=False),
            noise=Gaussian(1.0),
            expected_batch_size=float(B),
        )
    noise = None
    if config != "torch":
        noise = SecureGaussianNoise(engine.noise.std, prefetch=config == "secure prefetch")
        if noise.prefetch:
            noise.expect(engine.params)
        engine.noise = noise  # the wiring docs/engine.md proposes (engine-owned in the service)
    return engine, noise


def throughput(n: int) -> dict[str, float]:
    """Values per second of each generator into a preallocated buffer (best of 3 calls)."""
    import numpy as np

    def best(fn: Any) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return n / min(times)

    buf = torch.empty(n)
    words = np.empty(n, dtype=np.uint64)
    gen = torch.Generator().manual_seed(0)
    stream = SecureStream()
    out: dict[str, float] = {
        "torch.randn float32": best(lambda: torch.randn(n, generator=gen, out=buf))
    }
    for terms in (1, 2, 4):
        out[f"secure terms={terms} → float32"] = best(
            lambda t=terms: stream.normal_into(buf, terms=t)
        )
    out["ChaCha20 keystream (64-bit words)"] = best(lambda: stream.words_into(words))
    return out


def run_case(size: dict[str, int], lora: bool, steps: int) -> dict[str, Any]:
    model = build_model(size, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    batch = {
        "input_ids": torch.randint(0, size["vocab"], (B, T)),
        "attention_mask": torch.ones(B, T, dtype=torch.long),
    }
    batch["labels"] = batch["input_ids"].clone()
    # every configuration its own copy of the model (same weights): hooks are per model
    engines = {
        c: make_engine(model if i == 0 else build_model(size, lora), c)
        for i, c in enumerate(CONFIGS)
    }
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for round_ in range(steps + 1):  # round 0: warm-up
        for config in CONFIGS:
            engine, noise = engines[config]
            waited0 = noise.waited_s if noise is not None else 0.0
            t0 = time.perf_counter()
            engine.step(causal_lm_per_sample_loss, batch)
            dt = time.perf_counter() - t0
            if round_ > 0:
                times[config].append(dt)
                if noise is not None and noise.prefetch:
                    times.setdefault("waited", []).append(noise.waited_s - waited0)
            if noise is not None and noise.prefetch:
                # let the background thread finish the next step's noise before the other
                # configurations run, so that they do not share the core with it
                t1 = time.perf_counter()
                if noise._pending is not None:
                    noise._pending[1].result()
                times.setdefault("prefetch idle wait", []).append(time.perf_counter() - t1)
    # prefetch without a spare core's head start: consecutive steps, the next step's noise
    # generated while this one computes its gradients
    engine, noise = engines["secure prefetch"]
    assert noise is not None
    waited0 = noise.waited_s
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step(causal_lm_per_sample_loss, batch)
    times["prefetch overlapped"] = [(time.perf_counter() - t0) / steps]
    times["overlapped waited"] = [(noise.waited_s - waited0) / steps]
    # one step's noise alone, for every trainable parameter
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for p in params:
        torch.randn(p.shape, generator=gen, dtype=p.dtype)
    torch_noise = time.perf_counter() - t0
    secure = SecureGaussianNoise(1.0)
    t0 = time.perf_counter()
    for i, p in enumerate(params):
        secure.sample(i, p)
    secure_noise = time.perf_counter() - t0
    for _, noise in engines.values():
        if noise is not None:
            noise.close()
    return {
        "lora": lora,
        "trainable": trainable,
        "total": total,
        "median": {k: statistics.median(v) for k, v in times.items()},
        "torch_noise_s": torch_noise,
        "secure_noise_s": secure_noise,
    }


def report(results: list[dict[str, Any]], rates: dict[str, float], size: dict[str, int]) -> str:
    lines = [
        "# Secure-mode noise: cost per step",
        "",
        f"Generated by `benchmarks/secure_noise.py` on {datetime.now(UTC):%Y-%m-%d}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"`torch.set_num_threads(1)` (a 2-core machine shared with other jobs: expect ±20% noise).",
        "",
        f"Model: Llama, hidden {size['hidden']}, {size['layers']} layers, intermediate "
        f"{size['intermediate']}, vocab {size['vocab']}, tied embeddings, float32, CPU. Step: "
        f'`PrivacyEngine(norm_method="exact")`, SGD, B = {B}, T = {T}. Median over the '
        "measured steps (one warm-up step each, configurations interleaved).",
        "",
        "## Throughput (one thread)",
        "",
        "| generator | M values/s |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v / 1e6:.1f} |" for k, v in rates.items()]
    lines += [
        "",
        "## One training step",
        "",
        "| case | trainable params | step, torch noise (s) | step, secure sync (s) | "
        "step, secure prefetch (s) | step, prefetch overlapped (s) | overlapped: waited (s) | "
        "noise alone, torch (s) | noise alone, secure (s) | secure sync overhead | "
        "prefetch overhead | overlapped overhead |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        m = r["median"]
        base = m["torch"]
        lines.append(
            f"| {'LoRA r=8' if r['lora'] else 'full'} | {r['trainable'] / 1e6:.2f}M of "
            f"{r['total'] / 1e6:.1f}M | {base:.2f} | {m['secure sync']:.2f} | "
            f"{m['secure prefetch']:.2f} | {m['prefetch overlapped']:.2f} | "
            f"{m['overlapped waited']:.3f} | "
            f"{r['torch_noise_s']:.3f} | {r['secure_noise_s']:.3f} | "
            f"{(m['secure sync'] / base - 1) * 100:+.1f}% | "
            f"{(m['secure prefetch'] / base - 1) * 100:+.1f}% | "
            f"{(m['prefetch overlapped'] / base - 1) * 100:+.1f}% |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, 1 step, print only")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    size = QUICK if args.quick else FULL
    steps = 1 if args.quick else args.steps
    rates = throughput(1 << (20 if args.quick else 23))
    results = [run_case(size, lora, steps) for lora in (False, True)]
    text = report(results, rates, size)
    print(text)
    if not args.quick:
        out = ROOT / "docs" / "benchmarks" / "secure_noise.md"
        previous = out.read_text() if out.exists() else ""
        marker = "\n## Reading the numbers"
        tail = previous[previous.index(marker) :] if marker in previous else ""
        out.write_text(text + tail)


if __name__ == "__main__":
    main()
