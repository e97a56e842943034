"""Normalisation layers: ``y = x̂ ⊙ w (+ b)``; per-sample grads ``Σ_t G ⊙ x̂`` and ``Σ_t G``.

Gemma's RMSNorm scales by ``(1 + w)``: the same per-sample gradient ``Σ_t G ⊙ x̂``.

The normalised input ``x̂`` is recomputed from the saved input at backward time, following each
layer's own forward (dtype casts included), so no extra activation is kept.
"""

from __future__ import annotations

import torch
from torch import nn

from dprc_core.layers.base import LayerHandler, as_sequence, register, register_by_name


def _capture(module, inputs, output):
    return inputs[0].detach()


def _affine(module, xhat, g, weight_name="weight"):
    out = {}
    w = getattr(module, weight_name, None)
    if w is not None and w.requires_grad:
        out[weight_name] = (g * xhat.to(g.dtype)).sum(1)
    b = getattr(module, "bias", None)
    if b is not None and b.requires_grad:
        out["bias"] = g.sum(1)
    return out


def _layer_norm_contributions(module: nn.LayerNorm, x, g):
    shape = tuple(module.normalized_shape)
    xhat = torch.nn.functional.layer_norm(x, shape, None, None, module.eps)
    return _affine(module, as_sequence(xhat.reshape(*x.shape[: x.dim() - len(shape)], -1)),
                   g)


def _check_layer_norm(module: nn.LayerNorm) -> None:
    if len(module.normalized_shape) != 1:
        raise ValueError("LayerNorm over more than one dimension is not supported")


def _rms_norm_contributions(module: nn.RMSNorm, x, g):
    eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return _affine(module, as_sequence(xhat), g)


def _llama_rms_norm_contributions(module, x, g):
    # LlamaRMSNorm: computes in float32, casts back to the input dtype, then scales by weight.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
    return _affine(module, as_sequence(h.to(x.dtype)), g)


def _gemma_rms_norm_contributions(module, x, g):
    # GemmaRMSNorm: (x̂ · (1 + w)) computed in float32, cast back; per-sample grad Σ_t G ⊙ x̂.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.eps)
    return {"weight": (g.to(torch.float32) * as_sequence(h)).sum(1)} if (
        module.weight.requires_grad
    ) else {}


def _check_rms(module) -> None:
    if len(getattr(module, "normalized_shape", (0,))) != 1:
        raise ValueError("RMSNorm over more than one dimension is not supported")


register(nn.LayerNorm)(LayerHandler(_capture, _layer_norm_contributions, _check_layer_norm))
register(nn.RMSNorm)(LayerHandler(_capture, _rms_norm_contributions, _check_rms))

try:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
except ImportError:  # pragma: no cover
    LlamaRMSNorm = None
if LlamaRMSNorm is not None:
    register(LlamaRMSNorm)(
        LayerHandler(_capture, _llama_rms_norm_contributions, params=("weight",))
    )

register_by_name(
    "transformers.models.gemma.modeling_gemma.GemmaRMSNorm",
    "transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm",
    "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm",
)(LayerHandler(_capture, _gemma_rms_norm_contributions, params=("weight",)))
