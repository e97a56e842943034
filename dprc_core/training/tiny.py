"""Tiny models built locally (nothing downloaded): a character-level or byte-level tokenizer
and a small Llama, saved with ``save_pretrained`` so they load through the same code path as
any model. The service's built-in ``dprc-tiny-llama`` is built here too (byte-level)."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def char_tokenizer():
    """A character-level fast tokenizer over printable ASCII."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    )


def byte_tokenizer():
    """A byte-level fast tokenizer (every UTF-8 text encodes; no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


TOKENIZERS = {"char": char_tokenizer, "byte": byte_tokenizer}


def build_tiny_llama(
    path: str | Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    max_positions: int = 256,
    seed: int = 0,
    tokenizer: str = "char",
) -> Path:
    """Write a tiny random Llama + tokenizer (``char`` or ``byte``) to ``path`` (once; kept if
    present). Written into a temporary folder first, so a crash leaves no half-built model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
        return path
    tok = TOKENIZERS[tokenizer]()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if path.exists():  # an empty or partial folder: move the files in
        for item in tmp.iterdir():
            item.replace(path / item.name)
        tmp.rmdir()
    else:
        tmp.replace(path)
    return path
