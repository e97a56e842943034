"""Loading models offline: a local directory with safetensors weights, never remote code.

``trust_remote_code=False``, ``use_safetensors=True`` and ``local_files_only=True`` always:
nothing is downloaded, no pickle is unpickled.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
    """The tokenizer of a model folder, or of a folder holding a tokenizer alone (a LoRA
    checkpoint's: its adapter and the tokenizer it trained with); local, no remote code."""
    from transformers import AutoTokenizer

    folder = Path(path)
    if not (folder / "tokenizer_config.json").is_file():
        folder = check_model_dir(folder)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
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
        from peft import PeftModel, get_peft_model

        with peft_quietly():
            if adapter_path is not None:
                model = PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
            else:
                assert lora is not None
                model = get_peft_model(model, lora_config(lora, task))
    return model


@contextmanager
def peft_quietly() -> Iterator[None]:
    """Wrapping a model with peft without the FutureWarning peft triggers on every run
    (it reads transformers' deprecated ``is_gradient_checkpointing``); other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def lora_config(lora: LoraSpec, task: str) -> Any:
    """The PEFT ``LoraConfig`` of ``lora`` (the classification head is trained in full)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        lora_dropout=0.0,
        modules_to_save=["classifier", "score"] if task == "classification" else None,
    )


# -- validating a job's settings against a model, without its weights --------------------------


class ModelSettingError(ValueError):
    """A job setting the model cannot take; ``field`` names it (``max_seq_len``, ``lora`` or
    ``train_only``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")
_UNLIMITED = 10**9  # what a tokenizer_config says when it sets no limit (1e30 and the like)


def max_positions(path: str | Path) -> int | None:
    """The longest token sequence the model at ``path`` takes: its config's position limit
    (``max_position_embeddings``, ``n_positions``, ...) and its tokenizer's
    ``model_max_length``, the smaller of those it states; None if it states neither. Read from
    the JSON files only (no weights, no code)."""
    path = check_model_dir(path)
    config = json.loads((path / "config.json").read_text())
    limits = [int(config[k]) for k in _POSITION_KEYS if isinstance(config.get(k), int)][:1]
    tok_file = path / "tokenizer_config.json"
    if tok_file.is_file():
        tok_max = json.loads(tok_file.read_text()).get("model_max_length")
        if isinstance(tok_max, (int, float)) and 0 < tok_max < _UNLIMITED:
            limits.append(int(tok_max))
    return min(limits) if limits else None


def check_max_seq_len(path: str | Path, max_seq_len: int) -> None:
    """:class:`ModelSettingError` if ``max_seq_len`` exceeds :func:`max_positions`."""
    limit = max_positions(path)
    if limit is not None and max_seq_len > limit:
        raise ModelSettingError(
            "max_seq_len",
            f"max_seq_len={max_seq_len} exceeds the model's {limit} positions",
        )


def lora_target_matches(module_name: str, target: str) -> bool:
    """PEFT's rule for a list of ``target_modules``: the module's name is ``target`` or ends
    with ``.target``."""
    return module_name == target or module_name.endswith("." + target)


def matches_train_only(parameter_name: str, parts: list[str]) -> bool:
    """The runner's ``train_only`` rule: a parameter is kept if its name contains a part."""
    return any(part in parameter_name for part in parts)


def _meta_model(path: Path, task: str) -> nn.Module:
    """The model's architecture from its config on the meta device: no weights read, no
    memory for them (a classification head with 2 labels: its names do not depend on it)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    extra = {"num_labels": 2} if task == "classification" else {}
    config = AutoConfig.from_pretrained(
        path, trust_remote_code=False, local_files_only=True, **extra
    )
    auto = AutoModelForCausalLM if task == "causal_lm" else AutoModelForSequenceClassification
    with torch.device("meta"):
        model: nn.Module = auto.from_config(config, trust_remote_code=False)
    return model


def check_trainable(
    path: str | Path, task: str, lora: LoraSpec | None, train_only: list[str] | None
) -> list[str]:
    """The names of the parameters a job would train, as the runner selects them (LoRA
    through PEFT with :func:`lora_config`, then :func:`matches_train_only`), computed on the
    meta device; :class:`ModelSettingError` if a LoRA target module matches no module of the
    model (or one PEFT cannot adapt), or if nothing is left to train."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    path = check_model_dir(path)
    model = _meta_model(path, task)
    if lora is not None:
        names = [name for name, _ in model.named_modules()]
        missing = [
            t for t in lora.target_modules if not any(lora_target_matches(n, t) for n in names)
        ]
        if missing:
            leaves = sorted(
                {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
            )
            raise ModelSettingError(
                "lora",
                f"lora.target_modules {missing} match no module of the model; its linear "
                f"modules are named {leaves[:20]}",
            )
        from peft import get_peft_model

        try:
            with peft_quietly():
                model = get_peft_model(model, lora_config(lora, task))
        except ValueError as exc:  # e.g. a target that is a LayerNorm
            raise ModelSettingError("lora", f"lora.target_modules: {exc}") from exc
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    if train_only is not None:
        trained = [n for n in trained if matches_train_only(n, train_only)]
        if not trained:
            raise ModelSettingError(
                "train_only",
                f"train_only={train_only} matches no trainable parameter of the model"
                + (" (with LoRA: its adapters and head)" if lora is not None else ""),
            )
    return trained
