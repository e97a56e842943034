"""Loading a LoRA model prints none of peft's FutureWarning about transformers' deprecated
``is_gradient_checkpointing`` (it printed on every run), and other warnings still pass."""

from __future__ import annotations

import warnings

from dprc_core.training.models import LoraSpec, load_model, peft_quietly
from dprc_core.training.tiny import build_tiny_llama


def test_a_lora_model_loads_without_the_checkpointing_future_warning(tmp_path):
    path = build_tiny_llama(tmp_path / "m", hidden=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(path, "causal_lm", lora=LoraSpec(r=4))
    assert any(p.requires_grad for p in model.parameters())
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_only_that_warning_is_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with peft_quietly():
            warnings.warn(
                "`is_gradient_checkpointing` is deprecated and will go", FutureWarning, stacklevel=1
            )
            warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
