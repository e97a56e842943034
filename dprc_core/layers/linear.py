"""``nn.Linear`` and Hugging Face GPT-2 ``Conv1D``: ``S = A W (+ b)``.

Per-sample weight gradient: ``G_iᵀ A_i`` for Linear (weight ``(out, in)``) and ``A_iᵀ G_i`` for
Conv1D (weight ``(in, out)``); bias gradient ``Σ_t G_i[t]``. peft LoRA adapters are ``nn.Linear``
modules (``lora_A``, ``lora_B``) and are handled here too.

A subclass of ``nn.Linear`` that overrides ``forward`` (Falcon's ``FalconLinear`` computes
``x @ W.T + b`` itself) gets the Linear math only after its forward is verified to be
``F.linear(x, W, b)``: at construction on a generic input with random weights (float64), and on
its first real call; anything else is refused.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from dprc_core.estimators import MatrixContribution
from dprc_core.layers.base import (
    LayerHandler,
    UnsupportedModuleError,
    as_sequence,
    register,
    register_fallback,
)
from dprc_core.layers.probing import is_leaf, own_forward, probe_input, reproduces, rounding


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
    Conv1D = None  # type: ignore[assignment, misc]  # optional import: None marks it absent
if Conv1D is not None:
    register(Conv1D)(LayerHandler(capture=_capture, contributions=_conv1d_contributions))


# ----------------------------------------------------------- verified Linear subclasses
_VERIFIED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # real output checked once


def _overrides_linear_forward(module: nn.Module) -> bool:
    return (
        isinstance(module, nn.Linear)
        and is_leaf(module)
        and type(module).forward is not nn.Linear.forward
    )


def _refuse(why: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(
        f"overrides forward() of torch.nn.Linear, and its forward is not F.linear(x, weight, "
        f"bias) ({why}), so the Linear per-sample gradient math does not apply; register a "
        "handler for it with dprc_core.register (see docs/engine.md) or freeze it with "
        "requires_grad_(False)"
    )


def _linear_scale(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Elementwise bound scale of F.linear's rounding: (|x| |W|ᵀ + |b|)·√n."""
    scale = x.abs().double() @ w.abs().double().t() * (w.shape[1] ** 0.5 + 1)
    return scale + (b.abs().double() if b is not None else 0)


def _check_linear_subclass(module: nn.Linear) -> None:
    w = module.weight
    g = torch.Generator(device="cpu").manual_seed(2)
    wr = torch.randn(w.shape, generator=g, dtype=torch.float64).to(w.device)
    b = module._parameters.get("bias")
    br = (
        torch.randn(w.shape[0], generator=g, dtype=torch.float64).to(w.device)
        if (b is not None)
        else None
    )
    x = probe_input((2, 3, w.shape[1]), torch.float64, w.device)
    tensors = {"weight": wr} if b is None else {"weight": wr, "bias": br}
    try:
        y = own_forward(module, (x,), None, **tensors)
    except Exception as exc:
        raise _refuse(f"probing it raised {type(exc).__name__}: {exc}") from exc
    if not reproduces(y, F.linear(x, wr, br), _linear_scale(x, wr, br), rounding(x.dtype)):
        raise _refuse("a probe with random weights gave another output")


def _capture_linear_subclass(module, inputs, output):
    a = inputs[0].detach()
    if module not in _VERIFIED:
        w, b = module.weight.detach(), module.bias
        b = b.detach() if b is not None else None
        if not reproduces(
            output, F.linear(a, w, b), _linear_scale(a, w, b), rounding(output.dtype)
        ):
            raise UnsupportedModuleError(
                f"{type(module).__name__}: its output on this input is not F.linear(x, weight, "
                "bias); register a handler for it with dprc_core.register"
            )
        _VERIFIED.add(module)
    return a


register_fallback(_overrides_linear_forward)(
    LayerHandler(
        capture=_capture_linear_subclass,
        contributions=_linear_contributions,
        check=_check_linear_subclass,
    )
)
