"""Hugging Face models whose layers subclass nn.Embedding with their own forward (scaled word
embeddings, offset learned positional embeddings): exact norms against torch.func, float64.

Before the strict handler lookup these were treated as plain nn.Embedding and their norms were
off (×√d scale missing, positions without the offset) — every case here failed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Clipping, Exact, Gaussian, Hutch, UnsupportedModuleError
from dprc_core.layers import scaled_embedding
from dprc_core.losses import causal_lm_per_sample_loss
from tests.conftest import grad_norms, torch_func_per_sample_grads, trainable_named


def _load(model, cls, path):
    model.save_pretrained(path, safe_serialization=True)
    return cls.from_pretrained(path, use_safetensors=True, trust_remote_code=False).double()


def _lm_batch(vocab, b=3, t=9, left_pad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    if left_pad:
        mask[1, :3] = 0
    else:
        mask[1, 6:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 1), "attention_mask": mask}


def gemma(tmp_path):
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    cfg = GemmaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=1,
    )
    model = _load(GemmaForCausalLM(cfg), GemmaForCausalLM, tmp_path / "gemma")
    with torch.no_grad():  # GemmaRMSNorm weights start at 0 (scale 1 + w): make them matter
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0, 0.3)
    return model, causal_lm_per_sample_loss, _lm_batch(64)


def opt(tmp_path):
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(1)
    cfg = OPTConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        ffn_dim=32,
        num_attention_heads=2,
        max_position_embeddings=32,
        word_embed_proj_dim=16,
        pad_token_id=1,
    )
    model = _load(OPTForCausalLM(cfg), OPTForCausalLM, tmp_path / "opt")
    return model, causal_lm_per_sample_loss, _lm_batch(64, left_pad=True)  # mask-based positions


def biogpt(tmp_path):
    from transformers import BioGptConfig, BioGptForCausalLM

    torch.manual_seed(2)
    cfg = BioGptConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        scale_embedding=True,
        pad_token_id=1,
    )
    model = _load(BioGptForCausalLM(cfg), BioGptForCausalLM, tmp_path / "biogpt")
    return model, causal_lm_per_sample_loss, _lm_batch(64, left_pad=True)


def _seq2seq_loss(model, batch):
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    )
    logp = out.logits.log_softmax(-1)
    return -logp.gather(-1, batch["labels"][..., None])[..., 0].sum(-1)


def bart(tmp_path):
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(3)
    cfg = BartConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        scale_embedding=True,
        pad_token_id=1,
    )
    model = _load(
        BartForConditionalGeneration(cfg), BartForConditionalGeneration, tmp_path / "bart"
    )
    batch = _lm_batch(64)
    g = torch.Generator().manual_seed(4)
    batch["decoder_input_ids"] = torch.randint(3, 64, (3, 5), generator=g)
    batch["labels"] = torch.randint(3, 64, (3, 5), generator=g)
    return model, _seq2seq_loss, batch


CASES = {"gemma": gemma, "opt": opt, "biogpt": biogpt, "bart": bart}
SUBCLASSES = {
    "gemma": {"GemmaTextScaledWordEmbedding", "GemmaRMSNorm"},
    "opt": {"OPTLearnedPositionalEmbedding"},
    "biogpt": {"BioGptScaledWordEmbedding", "BioGptLearnedPositionalEmbedding"},
    "bart": {"BartScaledWordEmbedding", "BartLearnedPositionalEmbedding"},
}


@pytest.fixture(params=list(CASES))
def hf_case(request, tmp_path):
    model, loss_fn, batch = CASES[request.param](tmp_path)
    return request.param, model.eval(), loss_fn, batch


def test_models_use_the_subclasses(hf_case):
    name, model, _, _ = hf_case
    types = {type(m).__name__ for m in model.modules()}
    assert SUBCLASSES[name] <= types


@pytest.mark.parametrize("method", ["fgc", "ghost"])
def test_exact_norms_match_torch_func(hf_case, method):
    name, model, loss_fn, batch = hf_case
    ref = grad_norms(torch_func_per_sample_grads(model, loss_fn, batch))
    # OPT's MLP runs on a flattened (B·T, d) view: accepted once independence is checked
    got = dprc_core.per_sample_grad_norms(
        model, loss_fn, batch, method=method, check_independence=True
    )
    # Gemma's RMSNorm computes in float32 even in a float64 model
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=0)


def test_sigma0_step_equals_reference_clipped_update(hf_case):
    name, model, loss_fn, batch = hf_case
    per_sample = torch_func_per_sample_grads(model, loss_fn, batch)
    norms = grad_norms(per_sample)
    clip = float(norms.median())
    params = trainable_named(model)
    before = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.SGD(list(params.values()), lr=1.0)
    with pytest.warns(dprc_core.PrivacyWarning):
        engine = dprc_core.PrivacyEngine(
            model,
            opt,
            clipping=Clipping(clip, Exact()),
            noise=Gaussian(0.0),
            expected_batch_size=3.0,
        )
    engine.step(loss_fn, batch)
    factors = (clip / norms).clamp(max=1.0)
    scale = max(float(g.abs().max()) for g in per_sample.values()) / 3.0
    for n, p in params.items():
        want = torch.einsum("b,b...->...", factors, per_sample[n]) / 3.0
        torch.testing.assert_close(before[n] - p.detach(), want, rtol=1e-5, atol=1e-7 * scale)


class _Shifted(nn.Embedding):
    """Not of the form scale · weight[index]: adds a constant."""

    def forward(self, ids):
        return super().forward(ids) + 1.0


def test_flattened_layout_is_refused_without_the_independence_check(tmp_path):
    model, loss_fn, batch = opt(tmp_path)
    with pytest.raises(ValueError, match="flattened"):
        dprc_core.per_sample_grad_norms(
            model, loss_fn, batch, method="exact", check_independence=False
        )
    with pytest.raises(ValueError, match="flattened"):
        opt_ = torch.optim.SGD(model.parameters(), lr=0.1)
        dprc_core.PrivacyEngine(
            model,
            opt_,
            clipping=Clipping(1.0, Hutch(), check_independence=False),
            noise=Gaussian(1.0),
            expected_batch_size=3,
        ).step(loss_fn, batch)


def test_registered_subclass_whose_forward_does_not_fit_is_refused_at_the_step():
    dprc_core.register(_Shifted)(scaled_embedding.HANDLER)
    model = nn.Sequential(_Shifted(10, 4), nn.Linear(4, 2)).double()
    ids = torch.randint(0, 10, (3, 5))
    with pytest.raises(UnsupportedModuleError, match="_Shifted.*scale \\* weight\\[index\\]"):
        dprc_core.per_sample_grad_norms(model, lambda m, b: m(b).sum((1, 2)), ids)
