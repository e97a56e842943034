"""Loading models offline: a local directory with safetensors weights, never remote code.

``trust_remote_code=False``, ``use_safetensors=True`` and ``local_files_only=True`` always:
nothing is downloaded, no pickle is unpickled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dprc_core.training.data import TASKS

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class ModelLoadError(ValueError):
    """The model directory cannot be loaded safely."""


@dataclass
class LoraSpec:
    r: int = 8
    alpha: int = 16
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"lora.r must be a positive integer, got {self.r!r}")
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, (int, float))
            or (self.alpha <= 0)
        ):
            raise ValueError(f"lora.alpha must be a positive number, got {self.alpha!r}")
        if not self.target_modules or not all(isinstance(m, str) for m in self.target_modules):
            raise ValueError("lora.target_modules must be a non-empty list of module names")


def check_model_dir(path: str | Path) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"model directory {path} has no .safetensors weights (pickled .bin weights are refused)"
        )
    return path


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        check_model_dir(path), trust_remote_code=False, local_files_only=True
    )
    if tok.pad_token_id is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    path: str | Path,
    task: str,
    *,
    num_labels: int | None = None,
    lora: LoraSpec | None = None,
    dtype: str = "float32",
    adapter_path: str | Path | None = None,
) -> nn.Module:
    """A Hugging Face model from a local directory; LoRA-wrapped (base frozen) if asked.

    ``adapter_path`` loads trained LoRA weights (a checkpoint's) instead of fresh adapters.
    """
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    path = check_model_dir(path)
    kwargs: dict[str, Any] = dict(
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
        dtype=_DTYPES[dtype],
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model: PreTrainedModel | PeftModel  # PeftModel once LoRA-wrapped below
    if task == "causal_lm":
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    else:
        if num_labels is None or num_labels < 2:
            raise ValueError("classification needs num_labels >= 2")
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_labels, ignore_mismatched_sizes=True, **kwargs
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = getattr(model.config, "eos_token_id", None) or 0
    if lora is not None or adapter_path is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter_path is not None:
            model = PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
        else:
            assert lora is not None
            cfg = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                target_modules=list(lora.target_modules),
                lora_dropout=0.0,
                modules_to_save=["classifier", "score"] if task == "classification" else None,
            )
            model = get_peft_model(model, cfg)
    return model
