"""A catalogue of tiny Hugging Face models built from their configs (nothing from the hub).

Each :class:`Arch` builds its model with ``Config(...)``, saves it with safetensors and loads it
back the way users do, in float64 and eval mode, with every 1-D norm weight / bias perturbed so
that norm-layer gradients are non-trivial. It also gives a per-sample loss, a deterministic
batch (B=4, T=16, right padding on two samples) and a LoRA config for its attention
projections. Plain functions and data: usable from pytest and from scripts.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from dprc_core.losses import (  # noqa: E402
    causal_lm_per_sample_loss,
    sequence_classification_per_sample_loss,
)

VOCAB, B, T, T_DECODER = 128, 4, 16, 12
PAD, BOS, EOS, MASK = 0, 1, 2, 3  # token ids; sampled tokens are >= 4
NUM_LABELS = 3
LENGTHS = (T, 11, T, 6)  # samples 1 and 3 are right-padded
IGNORE = -100

# fmt: off
# llama-style config keywords, shared by most decoder families
DECODER = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
)
ENCODER = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=64, pad_token_id=PAD,
)
SEQ2SEQ = dict(
    vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
    decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS,
    eos_token_id=EOS, decoder_start_token_id=EOS,
)
QKV = ("q_proj", "v_proj")
# fmt: on


@dataclass(frozen=True)
class Arch:
    name: str
    config_cls: str  # a transformers config class name
    model_cls: str  # a transformers model class name
    config: dict[str, Any]
    task: str  # "clm" | "cls" | "mlm" | "s2s"
    lora_targets: tuple[str, ...]
    lora_extra: dict[str, Any] = field(default_factory=dict)
    load_kwargs: dict[str, Any] = field(default_factory=dict)  # for from_pretrained

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode()) % 2**31

    def build(self, path: Path | str) -> nn.Module:
        """Config -> random model -> save_pretrained (safetensors) -> from_pretrained."""
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()

        config_cls = getattr(transformers, self.config_cls)
        model_cls = getattr(transformers, self.model_cls)
        config = config_cls(**self.config)
        if self.task == "cls":
            config.num_labels = NUM_LABELS
        torch.manual_seed(self.seed)
        model_cls(config).save_pretrained(path, safe_serialization=True)
        model = model_cls.from_pretrained(
            path, use_safetensors=True, trust_remote_code=False, **self.load_kwargs
        )
        model = model.double().eval()
        randomise_norms(model, self.seed)
        return model

    @property
    def loss_fn(self) -> Callable[[nn.Module, Any], torch.Tensor]:
        return LOSSES[self.task]

    def batch(self) -> dict[str, torch.Tensor]:
        return make_batch(self.task, self.seed)

    def lora_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=list(self.lora_targets),
            lora_dropout=0.0,
            **self.lora_extra,
        )


def randomise_norms(model: nn.Module, seed: int, scale: float = 0.3) -> None:
    """Add N(0, scale²) to every 1-D parameter of every normalisation module (Gemma-style
    RMSNorms start at 0, LayerNorms at weight 1 / bias 0)."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if "norm" not in type(module).__name__.lower():
                continue
            for p in module.parameters(recurse=False):
                if p.dim() == 1:
                    p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def with_lora(model: nn.Module, arch: Arch) -> nn.Module:
    """peft LoRA (r=4) on the family's attention projections; lora_B randomised (it starts at
    zero) so that every factor matters. The base model is frozen."""
    from peft import get_peft_model

    model = get_peft_model(model, arch.lora_config())
    gen = torch.Generator().manual_seed(arch.seed + 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.double().eval()


# ---------------------------------------------------------------------------------- losses
def _token_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed token negative log-likelihood per sample; labels -100 do not count."""
    tok = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return tok.reshape(labels.shape).sum(1)


def masked_lm_per_sample_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return _token_nll(out.logits, batch["labels"])


def seq2seq_per_sample_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    )
    return _token_nll(out.logits, batch["labels"])


LOSSES: dict[str, Callable[[nn.Module, Any], torch.Tensor]] = {
    "clm": causal_lm_per_sample_loss,
    "cls": sequence_classification_per_sample_loss,
    "mlm": masked_lm_per_sample_loss,
    "s2s": seq2seq_per_sample_loss,
}


# --------------------------------------------------------------------------------- batches
def _padded(gen: torch.Generator, lengths, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(4, VOCAB, (B, t), generator=gen)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def make_batch(task: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids, mask = _padded(gen, LENGTHS, T)
    batch = {"input_ids": ids, "attention_mask": mask}
    if task == "cls":
        batch["labels"] = torch.tensor([0, 1, 2, 1])
    elif task == "mlm":  # mask ~30% of the real tokens (at least one per sample)
        chosen = (torch.rand(B, T, generator=gen) < 0.3) & (mask == 1)
        chosen[:, 1] = True
        batch["labels"] = ids.masked_fill(~chosen, IGNORE)
        batch["input_ids"] = ids.masked_fill(chosen, MASK)
    elif task == "s2s":
        target, tmask = _padded(gen, (T_DECODER, 8, 5, T_DECODER), T_DECODER)
        start = torch.full((B, 1), EOS)
        batch["decoder_input_ids"] = torch.cat([start, target[:, :-1]], 1)
        batch["labels"] = target.masked_fill(tmask == 0, IGNORE)
    return batch


# ----------------------------------------------------------------------------- catalogue
def _arch(name, config_cls, model_cls, config, task="clm", lora=QKV, load=None, **lora_extra):
    return Arch(name, config_cls, model_cls, config, task, tuple(lora), lora_extra, load or {})


_HEAD8 = dict(DECODER, head_dim=8)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
_EAGER_EXPERTS = {"experts_implementation": "eager"}  # the default grouped_mm has no float64

# fmt: off
ARCH_LIST = [
    _arch("llama", "LlamaConfig", "LlamaForCausalLM", DECODER),
    _arch("mistral", "MistralConfig", "MistralForCausalLM", DECODER),
    _arch("qwen2", "Qwen2Config", "Qwen2ForCausalLM", DECODER),
    _arch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", _HEAD8),
    _arch("phi", "PhiConfig", "PhiForCausalLM", DECODER),
    _arch("phi3", "Phi3Config", "Phi3ForCausalLM", DECODER, lora=["qkv_proj"]),
    _arch("gemma", "GemmaConfig", "GemmaForCausalLM", _HEAD8),
    _arch("gemma2", "Gemma2Config", "Gemma2ForCausalLM", _HEAD8),
    _arch("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", _HEAD8),
    _arch(
        "gpt2", "GPT2Config", "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64,
             bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True),
        lora=["c_attn"], fan_in_fan_out=True,
    ),
    _arch(
        "gptj", "GPTJConfig", "GPTJForCausalLM",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64,
             rotary_dim=4, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD),
    ),
    _arch(
        "gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
        dict(ENCODER, bos_token_id=BOS, eos_token_id=EOS), lora=["query_key_value"],
    ),
    _arch(
        "opt", "OPTConfig", "OPTForCausalLM",
        dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
             num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
             pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS),
    ),
    _arch(
        "bloom", "BloomConfig", "BloomForCausalLM",
        dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, pad_token_id=PAD,
             bos_token_id=BOS, eos_token_id=EOS),
        lora=["query_key_value"],
    ),
    _arch(
        "mpt", "MptConfig", "MptForCausalLM",
        dict(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2,
             max_seq_len=64, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS),
        lora=["Wqkv"],
    ),
    _arch("stablelm", "StableLmConfig", "StableLmForCausalLM", DECODER),
    _arch("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", DECODER),
    _arch("olmo", "OlmoConfig", "OlmoForCausalLM", DECODER),
    _arch("olmo2", "Olmo2Config", "Olmo2ForCausalLM", DECODER),
    _arch("cohere", "CohereConfig", "CohereForCausalLM", DECODER),
    _arch(
        "falcon", "FalconConfig", "FalconForCausalLM",
        dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS),
        lora=["query_key_value"],
    ),
    _arch(
        "mixtral", "MixtralConfig", "MixtralForCausalLM",
        dict(_HEAD8, num_local_experts=4, num_experts_per_tok=2), load=_EAGER_EXPERTS,
    ),
    _arch(
        "qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
        dict(DECODER, **_MOE, shared_expert_intermediate_size=32), load=_EAGER_EXPERTS,
    ),
    _arch(
        "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_HEAD8, **_MOE),
        load=_EAGER_EXPERTS,
    ),
    _arch("granite", "GraniteConfig", "GraniteForCausalLM", DECODER),
    _arch("nemotron", "NemotronConfig", "NemotronForCausalLM", _HEAD8),
    _arch("helium", "HeliumConfig", "HeliumForCausalLM", _HEAD8),
    _arch("glm", "GlmConfig", "GlmForCausalLM", _HEAD8),
    _arch(
        "codegen", "CodeGenConfig", "CodeGenForCausalLM",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64,
             n_ctx=64, rotary_dim=4, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD),
        lora=["qkv_proj"],
    ),
    _arch(
        "gpt_bigcode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64,
             bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD),
        lora=["c_attn"],
    ),
    _arch(
        "persimmon", "PersimmonConfig", "PersimmonForCausalLM",
        dict(ENCODER, bos_token_id=BOS, eos_token_id=EOS), lora=["query_key_value"],
    ),
    _arch("biogpt", "BioGptConfig", "BioGptForCausalLM", ENCODER),
    _arch("bert", "BertConfig", "BertForMaskedLM", ENCODER, "mlm", ["query", "value"]),
    _arch(
        "roberta", "RobertaConfig", "RobertaForSequenceClassification", ENCODER, "cls",
        ["query", "value"],
    ),
    _arch(
        "distilbert", "DistilBertConfig", "DistilBertForMaskedLM",
        dict(vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
             max_position_embeddings=64, pad_token_id=PAD),
        "mlm", ["q_lin", "v_lin"],
    ),
    _arch(
        "electra", "ElectraConfig", "ElectraForSequenceClassification",
        dict(ENCODER, embedding_size=16), "cls", ["query", "value"],
    ),
    _arch(
        "albert", "AlbertConfig", "AlbertForMaskedLM", dict(ENCODER, embedding_size=16),
        "mlm", ["query", "value"],
    ),
    _arch(
        "modernbert", "ModernBertConfig", "ModernBertForMaskedLM",
        dict(ENCODER, bos_token_id=BOS, eos_token_id=EOS, cls_token_id=BOS, sep_token_id=EOS),
        "mlm", ["Wqkv"],
    ),
    _arch(
        "deberta_v2", "DebertaV2Config", "DebertaV2ForSequenceClassification",
        dict(ENCODER, relative_attention=True, share_att_key=True, pos_att_type=["p2c", "c2p"],
             max_relative_positions=32, position_buckets=8),
        "cls", ["query_proj", "value_proj"],
    ),
    # XLNet's attention projections are raw 3-D nn.Parameters (no modules LoRA can wrap):
    # its LoRA adapters go on the feed-forward Linears instead
    _arch(
        "xlnet", "XLNetConfig", "XLNetForSequenceClassification",
        dict(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64,
             summary_type="first", pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS),
        "cls", ["layer_1", "layer_2"],
    ),
    _arch("bart", "BartConfig", "BartForConditionalGeneration", SEQ2SEQ, "s2s"),
    _arch("mbart", "MBartConfig", "MBartForConditionalGeneration", SEQ2SEQ, "s2s"),
    _arch(
        "t5", "T5Config", "T5ForConditionalGeneration",
        dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
             relative_attention_num_buckets=8, pad_token_id=PAD, eos_token_id=EOS,
             decoder_start_token_id=EOS),
        "s2s", ["q", "v"],
    ),
    _arch(
        "fsmt", "FSMTConfig", "FSMTForConditionalGeneration",
        dict({k: v for k, v in SEQ2SEQ.items() if k != "vocab_size"}, langs=["en", "de"],
             src_vocab_size=VOCAB, tgt_vocab_size=VOCAB),
        "s2s",
    ),
]
# fmt: on
ARCHS: dict[str, Arch] = {a.name: a for a in ARCH_LIST}

# architectures of the brief that transformers cannot build here: name -> reason
SKIPPED: dict[str, str] = {}
