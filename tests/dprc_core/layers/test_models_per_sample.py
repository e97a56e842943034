"""Per-sample gradient norms and the DP-SGD-RC step on real model families, against
torch.func per-sample gradients (float64)."""

from __future__ import annotations

import pytest
import torch

import dprc_core
from dprc_core import Auto, Clipping, Exact, Gaussian, Hutch
from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from tests.conftest import grad_norms, torch_func_per_sample_grads, trainable_named

EXACT = ["fgc", "ghost", "exact"]


def lm_batch(vocab: int, b: int = 4, t: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 8:] = 0  # right padding of different lengths
    if b > 3:
        mask[3, 5:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask}


def bert_batch(tokenizer) -> dict[str, torch.Tensor]:
    texts = [
        "the patient reported mild headaches after the second dose",
        "quarterly revenue grew faster than expected",
        "no",
        "a long sentence about privacy preserving machine learning with several clauses",
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    enc = {k: v for k, v in enc.items()}
    enc["labels"] = torch.tensor([0, 1, 2, 1])
    return enc


CASES = {
    "llama_gqa": ("tiny_llama", causal_lm_per_sample_loss),
    "gpt2_tied": ("tiny_gpt2", causal_lm_per_sample_loss),
    "lora_llama": ("lora_llama", causal_lm_per_sample_loss),
    "minilm_bert_cls": ("minilm_classifier", sequence_classification_per_sample_loss),
}


@pytest.fixture(params=list(CASES))
def case(request):
    fixture, loss_fn = CASES[request.param]
    model = request.getfixturevalue(fixture)
    if request.param == "minilm_bert_cls":
        batch = bert_batch(request.getfixturevalue("bert_tokenizer"))
    else:
        batch = lm_batch(model.config.vocab_size)
    return request.param, model, loss_fn, batch


def test_lora_model_trains_only_adapters(lora_llama):
    names = list(trainable_named(lora_llama))
    assert names and all("lora_" in n for n in names)


@pytest.mark.parametrize("method", EXACT)
def test_exact_norms_match_torch_func(case, method):
    name, model, loss_fn, batch = case
    ref = grad_norms(torch_func_per_sample_grads(model, loss_fn, batch))
    norms = dprc_core.per_sample_grad_norms(model, loss_fn, batch, method=method)
    assert norms.shape == ref.shape
    torch.testing.assert_close(norms, ref, rtol=1e-5, atol=0)
    assert all(p.grad is None for p in model.parameters()), "must leave no .grad behind"


def _reference_update(per_sample, norms, clip_norm, expected_batch_size):
    factors = (clip_norm / norms).clamp(max=1.0)
    return {
        n: torch.einsum("b,b...->...", factors, g) / expected_batch_size
        for n, g in per_sample.items()
    }


@pytest.mark.parametrize("clipped_sum", ["two_pass", "bookkeeping"])
def test_sigma0_step_equals_reference_clipped_update(case, clipped_sum):
    """σ = 0, exact norms: the update equals Σ_i min(1, C/‖g_i‖) g_i / B from torch.func,
    also when the logical batch arrives in micro-batches, one of them empty."""
    name, model, loss_fn, batch = case
    per_sample = torch_func_per_sample_grads(model, loss_fn, batch)
    ref_norms = grad_norms(per_sample)
    clip_norm = float(ref_norms.median())  # some samples clipped, some not
    expected_b = 5.0
    want = _reference_update(per_sample, ref_norms, clip_norm, expected_b)

    params = trainable_named(model)
    before = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.SGD(list(params.values()), lr=1.0)
    engine = dprc_core.PrivacyEngine(
        model,
        opt,
        clipping=Clipping(clip_norm, Exact(), clipped_sum=clipped_sum),
        noise=Gaussian(0.0),
        expected_batch_size=expected_b,
    )
    take = lambda s: {k: v[s] for k, v in batch.items()}  # noqa: E731
    engine.accumulate(loss_fn, take(slice(0, 1)))
    engine.accumulate(loss_fn, take(slice(1, 1)))  # empty micro-batch
    stats = engine.step(loss_fn, take(slice(1, None)))
    engine.detach()

    # Llama's RMSNorm runs in float32 even in a float64 model: compare at 1e-5 relative
    # (atol relative to the largest update: e.g. attention key biases have ~0 gradient)
    scale = max(float(w.abs().max()) for w in want.values())
    for n, p in params.items():
        torch.testing.assert_close(before[n] - p.detach(), want[n], rtol=1e-5, atol=1e-7 * scale)
    torch.testing.assert_close(stats.per_sample_norms, ref_norms, rtol=1e-5, atol=0)
    assert stats.batch_size == ref_norms.shape[0]
    assert stats.clipped_fraction == pytest.approx(float((ref_norms > clip_norm).float().mean()))


def test_padding_never_contributes(tiny_llama):
    """A right-padded sequence has the same per-sample gradient norm as the sequence alone,
    whatever token ids sit in the padded positions."""
    batch = lm_batch(tiny_llama.config.vocab_size)
    other = {k: v.clone() for k, v in batch.items()}
    other["input_ids"][1, 8:] = 7  # different junk under the padding
    for method in ("ghost", "fgc"):
        a = dprc_core.per_sample_grad_norms(tiny_llama, causal_lm_per_sample_loss, batch, method)
        b = dprc_core.per_sample_grad_norms(tiny_llama, causal_lm_per_sample_loss, other, method)
        alone = {"input_ids": batch["input_ids"][1:2, :8]}
        c = dprc_core.per_sample_grad_norms(tiny_llama, causal_lm_per_sample_loss, alone, method)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=0)
        torch.testing.assert_close(a[1:2], c, rtol=1e-10, atol=0)


def test_auto_reports_a_method_per_layer(tiny_gpt2):
    batch = lm_batch(tiny_gpt2.config.vocab_size)
    params = trainable_named(tiny_gpt2)
    opt = torch.optim.SGD(list(params.values()), lr=0.1)
    engine = dprc_core.PrivacyEngine(
        tiny_gpt2,
        opt,
        clipping=Clipping(1.0, Auto(batch["input_ids"].shape[1], k=4)),
        noise=Gaussian(0.0),
        expected_batch_size=4,
        seed=0,
    )
    stats = engine.step(causal_lm_per_sample_loss, batch)
    assert set(stats.methods) == set(params)
    assert engine.accounting_envelope == "hutch"
    assert set(stats.methods.values()) <= {"exact", "fgc", "ghost", "hutch"}
    for n, p in params.items():
        if p.dim() == 1:
            assert stats.methods[n] == "exact"  # biases and norm weights: exact, O(B·d)
    # k=4 makes sketches cheaper than exact for the 48×16 token embedding: tied -> hutch
    assert stats.methods["transformer.wte.weight"] == "hutch"


@pytest.mark.parametrize("method", ["hutch", "hutchpp"])
def test_tied_sketch_is_unbiased_for_the_summed_gradient(tiny_gpt2, method):
    """Sketches of a tied parameter share one projection and are summed before the norm, so
    E[n̂²] = ‖g_wte + g_lm_head‖² (summing the parts' squared norms would be biased by the
    cross term 2⟨g_wte, g_lm_head⟩)."""
    model = tiny_gpt2
    for n, p in model.named_parameters():
        p.requires_grad_(n == "transformer.wte.weight")
    batch = lm_batch(model.config.vocab_size, b=2, t=10)
    per_sample = torch_func_per_sample_grads(model, causal_lm_per_sample_loss, batch)
    exact_sq = grad_norms(per_sample) ** 2
    gen = torch.Generator().manual_seed(1234)
    draws = torch.stack(
        [
            dprc_core.per_sample_grad_norms(
                model, causal_lm_per_sample_loss, batch, method=method, k=4, generator=gen
            )
            ** 2
            for _ in range(300)
        ]
    )
    n = draws.shape[0]
    mean, sd = draws.mean(0), draws.std(0)
    # CLT bound, z = 5 (two-sided false-failure probability ≈ 6e-7 per sample)
    assert torch.all((mean - exact_sq).abs() <= 5 * sd / n**0.5 + 1e-12), (mean, exact_sq)


def test_gradient_checkpointing_is_refused_at_construction(tiny_llama):
    tiny_llama.gradient_checkpointing_enable()
    tiny_llama.train()
    batch = lm_batch(tiny_llama.config.vocab_size)
    with pytest.raises(dprc_core.UnsupportedModuleError, match="gradient checkpointing"):
        dprc_core.per_sample_grad_norms(tiny_llama, causal_lm_per_sample_loss, batch)
    opt = torch.optim.SGD(tiny_llama.parameters(), lr=0.1)
    with pytest.raises(dprc_core.UnsupportedModuleError, match="gradient checkpointing"):
        dprc_core.PrivacyEngine(
            tiny_llama,
            opt,
            clipping=Clipping(1.0, Hutch()),
            noise=Gaussian(1.0),
            expected_batch_size=4,
        )


def test_gradient_checkpointing_switched_on_later_is_refused_at_the_step(tiny_llama):
    opt = torch.optim.SGD(tiny_llama.parameters(), lr=0.1)
    engine = dprc_core.PrivacyEngine(
        tiny_llama, opt, clipping=Clipping(1.0, Hutch()), noise=Gaussian(1.0), expected_batch_size=4
    )
    tiny_llama.gradient_checkpointing_enable()
    tiny_llama.train()
    with pytest.raises(dprc_core.UnsupportedModuleError, match="gradient checkpointing"):
        engine.step(causal_lm_per_sample_loss, lm_batch(tiny_llama.config.vocab_size))
