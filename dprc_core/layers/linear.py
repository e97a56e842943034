"""``nn.Linear`` and Hugging Face GPT-2 ``Conv1D``: ``S = A W (+ b)``.

Per-sample weight gradient: ``G_iᵀ A_i`` for Linear (weight ``(out, in)``) and ``A_iᵀ G_i`` for
Conv1D (weight ``(in, out)``); bias gradient ``Σ_t G_i[t]``. peft LoRA adapters are ``nn.Linear``
modules (``lora_A``, ``lora_B``) and are handled here too.
"""

from __future__ import annotations

from torch import nn

from dprc_core.estimators import MatrixContribution
from dprc_core.layers.base import LayerHandler, as_sequence, register


def _capture(module, inputs, output):
    return inputs[0].detach()


def _linear_contributions(module: nn.Linear, a, g):
    a = as_sequence(a)
    out = {}
    if module.weight.requires_grad:
        out["weight"] = MatrixContribution(left=g, right=a)
    if module.bias is not None and module.bias.requires_grad:
        out["bias"] = g.sum(1)
    return out


def _conv1d_contributions(module, a, g):
    a = as_sequence(a)
    out = {}
    if module.weight.requires_grad:
        out["weight"] = MatrixContribution(left=a, right=g)
    if module.bias is not None and module.bias.requires_grad:
        out["bias"] = g.sum(1)
    return out


register(nn.Linear)(LayerHandler(capture=_capture, contributions=_linear_contributions))

try:  # transformers is a dependency, but keep the core importable without it
    from transformers.pytorch_utils import Conv1D
except ImportError:  # pragma: no cover
    Conv1D = None
if Conv1D is not None:
    register(Conv1D)(LayerHandler(capture=_capture, contributions=_conv1d_contributions))
