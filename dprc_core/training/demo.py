"""Library demo: DP fine-tuning of a tiny locally built Llama with DP-SGD-RC (Hutchinson).

Everything is made here (model, data); nothing is downloaded. The run calibrates σ for a target
(ε, δ) with the accountant, trains with Poisson-sampled batches, records the steps in a privacy
ledger, and writes a safetensors checkpoint plus the ledger JSON.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from dprc_core.accounting import PrivacyLedger, SubsampledGaussianEvent, noise_multiplier
from dprc_core.clipping import Clipping, Hutch
from dprc_core.engine import PrivacyEngine
from dprc_core.losses import causal_lm_per_sample_loss
from dprc_core.noise import Gaussian
from dprc_core.training.plan import default_delta
from dprc_core.training.sampling import PoissonSampler

VOCAB, SEQ, N = 64, 32, 512


def synthetic_corpus(n: int, seed: int = 0) -> torch.Tensor:
    """Sequences of a toy language: arithmetic progressions mod VOCAB (learnable, private-ish)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(1, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 5, (n, 1), generator=g)
    return 1 + (start + stride * torch.arange(SEQ)) % (VOCAB - 1)


def build_model(path: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (path / "model.safetensors").exists():
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            pad_token_id=0,
        )
        LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return LlamaForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False)


def run(
    out_dir: Path = Path("runs/demo"),
    epsilon: float = 8.0,
    delta: float | None = None,
    batch_size: int = 32,
    epochs: int = 2,
    k: int = 32,
) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    delta = default_delta(N) if delta is None else delta  # 1/N^1.1, as every other entry point
    data = synthetic_corpus(N)
    q = batch_size / N
    steps = epochs * math.ceil(N / batch_size)
    sigma = noise_multiplier(epsilon, delta, q, steps, envelope="hutch", k=k)
    print(
        f"calibrated noise multiplier σ={sigma:.4f} for ε={epsilon}, δ={delta}, q={q:.4f}, "
        f"{steps} steps, Hutchinson k={k} (dimension-free envelope)"
    )
    model = build_model(out_dir / "base-model").train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, Hutch(k)),
        noise=Gaussian(sigma),
        expected_batch_size=q * N,
    )
    # Charge the whole planned run before the first step: a crash never leaves steps unrecorded.
    # σ was calibrated in the revealed-scale model (the accountant's default sketch), which
    # also bounds the per-example sketch the engine draws; the ledger records that model.
    ledger = PrivacyLedger()
    ledger.record(SubsampledGaussianEvent(sigma, q, steps, engine.accounting_envelope, k))
    (out_dir / "privacy_ledger.json").write_text(ledger.to_json())
    t0 = time.perf_counter()
    for idx in PoissonSampler(N, q, steps):
        stats = engine.step(causal_lm_per_sample_loss, {"input_ids": data[idx]})
        if stats.step % 8 == 0 or stats.step == 1:
            print(
                f"step {stats.step:3d}  batch {stats.batch_size:3d}  loss {stats.mean_loss:.3f}"
                f"  clipped {stats.clipped_fraction:.2f}"
            )
    spent = ledger.epsilon(delta)
    engine.detach()
    model.save_pretrained(out_dir / "checkpoint", safe_serialization=True)
    summary = {
        "epsilon_spent": spent,
        "delta": delta,
        "noise_multiplier": sigma,
        "steps": steps,
        "seconds": round(time.perf_counter() - t0, 1),
        "checkpoint": str(out_dir / "checkpoint"),
    }
    print(json.dumps(summary, indent=2))
    return summary
