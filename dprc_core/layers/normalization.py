"""Normalisation layers: ``y = x̂ ⊙ w (+ b)``; per-sample grads ``Σ_t G ⊙ x̂`` and ``Σ_t G``.

Gemma's RMSNorm scales by ``(1 + w)``: the same per-sample gradient ``Σ_t G ⊙ x̂``.

``nn.LayerNorm``, ``nn.RMSNorm``, Llama's and Gemma's RMSNorm have handlers that recompute
``x̂`` from the saved input at backward time, following each layer's own forward.

Every other Hugging Face family ships its own copy (``MistralRMSNorm``, ``Qwen2RMSNorm``,
``T5LayerNorm``, ``CohereLayerNorm``, …). Rather than copying each, the **probed** handler
serves any leaf module whose trainable parameters are a 1-D ``weight`` (and optionally a 1-D
``bias`` of the same size) and whose forward is ``x̂(inputs) ⊙ s(w) + b`` with ``s(w) = w`` or
``1 + w``, where ``x̂`` does not depend on ``w`` or ``b``. It reads ``x̂`` off the module's own
forward, run with ``w`` replaced by ones (or zeros for the ``1 + w`` form) and ``b`` by zeros,
so the layer's own arithmetic (dtype casts included) gives ``x̂``. It verifies the form:

* at construction, on a fixed generic input in float64: the output is 0 at ``w = 0`` (or
  ``x̂`` for the ``1 + w`` form), linear in ``w`` at a random point, and shifted by exactly
  ``b`` at a random ``b``; anything else is refused, naming the module;
* at every call, on the real input: ``x̂ ⊙ s(w) + b`` must reproduce the real output to a few
  rounding units of its dtype, or the step is refused.
"""

from __future__ import annotations

import weakref
from typing import cast

import torch
from torch import nn

from dprc_core.layers.base import (
    LayerHandler,
    UnsupportedModuleError,
    as_sequence,
    register,
    register_by_name,
    register_fallback,
)
from dprc_core.layers.probing import is_leaf, own_forward, probe_input, reproduces, rounding


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
    return _affine(module, as_sequence(xhat.reshape(*x.shape[: x.dim() - len(shape)], -1)), g)


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
    return (
        {"weight": (g.to(torch.float32) * as_sequence(h)).sum(1)}
        if (module.weight.requires_grad)
        else {}
    )


def _check_rms(module) -> None:
    if len(getattr(module, "normalized_shape", (0,))) != 1:
        raise ValueError("RMSNorm over more than one dimension is not supported")


register(nn.LayerNorm)(LayerHandler(_capture, _layer_norm_contributions, _check_layer_norm))
register(nn.RMSNorm)(LayerHandler(_capture, _rms_norm_contributions, _check_rms))

try:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
except ImportError:  # pragma: no cover
    LlamaRMSNorm = None  # type: ignore[assignment, misc]  # optional import: None marks it absent
if LlamaRMSNorm is not None:
    register(LlamaRMSNorm)(
        LayerHandler(_capture, _llama_rms_norm_contributions, params=("weight",))
    )

register_by_name(
    "transformers.models.gemma.modeling_gemma.GemmaRMSNorm",
    "transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm",
    "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm",
)(LayerHandler(_capture, _gemma_rms_norm_contributions, params=("weight",)))


# ------------------------------------------------------------------------ probed handler
# module -> True for the ``1 + w`` form, False for ``w``; set by the construction-time probe
_OFFSET: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def _is_elementwise_affine(module: nn.Module) -> bool:
    if not is_leaf(module) or isinstance(module, (nn.Linear, nn.Embedding)):
        return False
    params = dict(module.named_parameters(recurse=False))
    w, b = params.get("weight"), params.get("bias")
    if w is None or w.dim() != 1 or set(params) - {"weight", "bias"}:
        return False
    return b is None or b.shape == w.shape


def _bias(module: nn.Module) -> torch.Tensor | None:
    b = module._parameters.get("bias")
    return b if isinstance(b, torch.Tensor) else None


def _run(module, x, weight, bias):
    tensors = {"weight": weight}
    if _bias(module) is not None:
        tensors["bias"] = bias if bias is not None else torch.zeros_like(weight)
    return own_forward(module, (x,), None, **tensors)


def _refuse(module: nn.Module, why: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(
        f"is not an elementwise affine normalisation x̂ ⊙ w + b ({why}), and no handler is "
        f"registered for {type(module).__name__}; freeze it with requires_grad_(False) or "
        "register a handler with dprc_core.register (see docs/engine.md)"
    )


def _weight(module: nn.Module) -> torch.Tensor:
    # _is_elementwise_affine admitted the module: its ``weight`` is a 1-D parameter
    return cast(torch.Tensor, module.weight)


def _probe_form(module: nn.Module, dtype: torch.dtype) -> bool:
    w = _weight(module)
    d = w.shape[0]
    x = probe_input((2, 3, d), dtype, w.device)
    zeros, ones = (
        torch.zeros(d, dtype=dtype, device=w.device),
        torch.ones(d, dtype=dtype, device=w.device),
    )
    y0 = _run(module, x, zeros, None)
    if not isinstance(y0, torch.Tensor) or y0.shape != x.shape:
        raise _refuse(module, "its output is not a tensor of its input's shape")
    offset = not bool((y0 == 0).all())
    xhat = y0 if offset else _run(module, x, ones, None)
    tol = rounding(y0.dtype)
    g = torch.Generator(device="cpu").manual_seed(1)
    wr = (torch.randn(d, generator=g, dtype=torch.float64) + 0.5).to(dtype=dtype, device=w.device)
    s = (1 + wr) if offset else wr
    if not reproduces(_run(module, x, wr, None), xhat * s, (xhat * s).abs(), tol):
        raise _refuse(module, "its output is not linear in the weight")
    if _bias(module) is not None:
        br = torch.randn(d, generator=g, dtype=torch.float64).to(dtype=dtype, device=w.device)
        base = zeros if offset else ones
        if not reproduces(_run(module, x, base, br), xhat + br, xhat.abs() + br.abs(), tol):
            raise _refuse(module, "the bias is not added to the output")
    return offset


def _check_elementwise_affine(module: nn.Module) -> None:
    try:
        offset = _probe_form(module, torch.float64)
    except UnsupportedModuleError:
        raise
    except Exception:  # a forward that cannot run in float64: probe in its own dtype
        try:
            offset = _probe_form(module, _weight(module).dtype)
        except UnsupportedModuleError:
            raise
        except Exception as exc:
            why = f"probing its forward raised {type(exc).__name__}: {exc}"
            raise _refuse(module, why) from exc
    _OFFSET[module] = offset


def _probed_capture(module, inputs, output):
    offset = _OFFSET[module]
    w = module.weight
    base = torch.zeros_like(w) if offset else torch.ones_like(w)
    xhat = _run(module, inputs[0], base, None)
    b = _bias(module)
    s = (1 + w.detach()) if offset else w.detach()
    expected = xhat * s + (b.detach() if b is not None else 0)
    scale = (xhat * s).abs() + (b.detach().abs() if b is not None else 0)
    if not reproduces(output, expected, scale, rounding(output.dtype)):
        raise UnsupportedModuleError(
            f"{type(module).__name__}: x̂ ⊙ w + b, read off its forward, does not reproduce "
            "its output on this input; register a handler for it with dprc_core.register"
        )
    return xhat.detach()


def _probed_contributions(module, xhat, g):
    return _affine(module, as_sequence(xhat), g)


PROBED_NORMALISATION = LayerHandler(
    capture=_probed_capture,
    contributions=_probed_contributions,
    check=_check_elementwise_affine,
    params=("weight", "bias"),
)
register_fallback(_is_elementwise_affine)(PROBED_NORMALISATION)
