"""PrivacyEngine: the DP-SGD-RC step (DESIGN.md §3).

One logical (Poisson-sampled) batch, possibly split into micro-batches:

1. forward; 2. norm backward yielding per-sample norm estimates n̂_i (no parameter gradients);
3. clip factors c_i = min(1, C / n̂_i); 4. clipped sum Σ_i c_i g_i, either by a second backward
on Σ_i c_i L_i (``clipping_mode="two_pass"``) or from the stored layer factors or per-sample
gradients, whichever is smaller (``clipping_mode="bookkeeping"``, the default: no second
backward); 5. once per logical batch: add
N(0, σ²C²) per coordinate, divide by the expected batch size, ``optimizer.step()``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dprc_core.estimators import METHODS, RANDOMIZED_METHODS, MatrixContribution
from dprc_core.hooks import PerSampleHooks, batch_size, trainable_parameters
from dprc_core.noise import GaussianNoise

LossFn = Callable[[nn.Module, Any], torch.Tensor]
CLIPPING_MODES = ("two_pass", "bookkeeping")


@dataclass
class StepStats:
    """What one logical batch did."""

    step: int
    batch_size: int  # samples actually in the logical batch (Poisson: random)
    per_sample_norms: torch.Tensor  # (batch_size,) estimated per-sample gradient norms
    clipped_fraction: float  # fraction of samples with c_i < 1 (0.0 for an empty batch)
    mean_loss: float  # mean per-sample loss (nan for an empty batch)
    methods: dict[str, str] = field(default_factory=dict)  # parameter -> norm method used


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (sketch dimension) must be an integer >= 1, got {k!r}")
    return k


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown norm method {method!r}; expected one of {METHODS}")
    return method


class _Generators:
    """One torch.Generator per device, all derived from the engine seed."""

    def __init__(self, seed: int):
        self.seed = seed
        self._by_device: dict[str, torch.Generator] = {}

    def __call__(self, device: torch.device | str) -> torch.Generator:
        device = torch.device(device)
        key = str(device)
        if key not in self._by_device:
            gen = torch.Generator(device=device)
            gen.manual_seed((self.seed + len(self._by_device) * 0x9E3779B97F4A7C15) % 2**63)
            self._by_device[key] = gen
        return self._by_device[key]


def per_sample_grad_norms(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    method: str = "exact",
    k: int = 32,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """L2 norm of each sample's gradient over all parameters with ``requires_grad=True``.

    ``loss_fn(model, batch)`` must return per-sample losses of shape [B]. Leaves no ``.grad``
    behind. ``method``: fgc | ghost | exact | hutch | hutchpp | auto (see DESIGN.md §2).
    """
    _check_method(method)
    _check_k(k)
    hooks = PerSampleHooks(model)
    try:
        _, result = hooks.norm_pass(
            loss_fn,
            batch,
            method=method,
            k=k,
            generator_for=lambda device: generator,
            retain_graph=False,
            keep_contributions=False,
        )
    finally:
        hooks.remove()
    return result.sq_norms.clamp(min=0).sqrt()


class PrivacyEngine:
    """DP-SGD with (randomized) per-sample clipping for a model and its optimizer."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        max_grad_norm: float,
        noise_multiplier: float,
        expected_batch_size: float,
        norm_method: str = "hutch",
        k: int = 32,
        seed: int | None = None,
        clipping_mode: str = "bookkeeping",
    ):
        if not (isinstance(max_grad_norm, (int, float)) and math.isfinite(max_grad_norm)
                and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a finite number > 0, got {max_grad_norm!r}")
        if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier)
                and noise_multiplier >= 0):
            raise ValueError(
                f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}"
            )
        if not (isinstance(expected_batch_size, (int, float)) and expected_batch_size > 0):
            raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size!r}")
        if clipping_mode not in CLIPPING_MODES:
            raise ValueError(
                f"clipping_mode must be one of {CLIPPING_MODES}, got {clipping_mode!r}"
            )
        self.model = model
        self.optimizer = optimizer
        self.max_grad_norm = float(max_grad_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.norm_method = _check_method(norm_method)
        self.k = _check_k(k)
        self.clipping_mode = clipping_mode
        self.params = trainable_parameters(model)
        self._check_optimizer()
        self.seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed)
        self.generators = _Generators(self.seed)
        self.noise = GaussianNoise(self.noise_multiplier * self.max_grad_norm)
        self.hooks = PerSampleHooks(model)
        self.steps = 0
        self._reset_batch()

    # ------------------------------------------------------------------ public API
    @property
    def randomized(self) -> bool:
        """Whether any layer may use a randomized norm estimate (for the accountant)."""
        return self.norm_method in (*RANDOMIZED_METHODS, "auto")

    @property
    def accounting_clipping(self) -> str:
        """The ``clipping`` argument of the accountant that covers this engine's mechanism.

        ``auto`` mixes exact and Hutchinson layers; the dimension-free envelope (DESIGN.md §4)
        is valid for any such mix, so it is accounted as ``"hutch"``.
        """
        if self.norm_method in ("hutch", "auto"):
            return "hutch"
        if self.norm_method == "hutchpp":
            return "hutchpp"
        return "exact"

    def accumulate(self, loss_fn: LossFn, batch: Any) -> None:
        """Add one micro-batch's clipped per-sample gradients to the logical batch."""
        if not self._in_batch:
            for p in self.params:
                p.grad = None
            self._in_batch = True
        if batch_size(batch) == 0:
            return  # an empty (Poisson) micro-batch contributes nothing
        two_pass = self.clipping_mode == "two_pass"
        losses, result = self.hooks.norm_pass(
            loss_fn,
            batch,
            method=self.norm_method,
            k=self.k,
            generator_for=self.generators,
            retain_graph=two_pass,
            keep_contributions=not two_pass,
        )
        norms = result.sq_norms.clamp(min=0).sqrt()
        clip = (self.max_grad_norm / norms).clamp(max=1.0)  # n̂ = 0 gives inf -> 1
        if two_pass:
            weighted = (losses * clip.to(losses.dtype).detach()).sum()
            torch.autograd.backward(weighted, inputs=self.params)
        else:
            self._bookkeeping_sum(result.contributions, clip)
        self._norms.append(norms.detach())
        self._losses.append(result.losses.detach())
        self._clipped += int((clip < 1).sum())
        self._methods.update(result.methods)

    def step(self, loss_fn: LossFn | None = None, batch: Any = None) -> StepStats:
        """Finish the logical batch: noise once, divide by the expected batch size, step."""
        if (loss_fn is None) != (batch is None):
            raise ValueError("pass both loss_fn and batch, or neither (after accumulate())")
        if loss_fn is not None:
            self.accumulate(loss_fn, batch)
        if not self._in_batch:  # an empty logical batch: still a (noise-only) step
            for p in self.params:
                p.grad = None
        with torch.no_grad():
            for p in self.params:
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                noise = self.noise.sample(grad, self.generators(grad.device))
                if noise is not None:
                    grad = grad + noise
                p.grad = grad / self.expected_batch_size
        self.optimizer.step()
        self.steps += 1
        norms = torch.cat(self._norms) if self._norms else torch.zeros(0)
        losses = torch.cat(self._losses) if self._losses else torch.zeros(0)
        n = int(norms.shape[0])
        stats = StepStats(
            step=self.steps,
            batch_size=n,
            per_sample_norms=norms,
            clipped_fraction=self._clipped / n if n else 0.0,
            mean_loss=float(losses.float().mean()) if n else float("nan"),
            methods=dict(self._methods),
        )
        self._reset_batch()
        return stats

    def detach(self) -> None:
        """Remove the hooks from the model."""
        self.hooks.remove()

    # ------------------------------------------------------------------ internals
    def _reset_batch(self) -> None:
        self._in_batch = False
        self._norms: list[torch.Tensor] = []
        self._losses: list[torch.Tensor] = []
        self._clipped = 0
        self._methods: dict[str, str] = {}

    def _check_optimizer(self) -> None:
        trainable = {id(p) for p in self.params}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in trainable:
                    raise ValueError(
                        "the optimizer holds a parameter that is not a trainable parameter of "
                        "the model; its update would not be privatized"
                    )

    @torch.no_grad()
    def _bookkeeping_sum(self, contributions: dict[int, list], clip: torch.Tensor) -> None:
        for p in self.params:
            contribs = contributions.get(id(p))
            if not contribs:
                continue
            w = clip.to(p.dtype)
            total = torch.zeros_like(p)
            for c in contribs:
                if isinstance(c, MatrixContribution):
                    total += c.weighted_sum(w.to(_dense_dtype(c))).to(p.dtype)
                else:  # per-sample gradients (B, *p.shape)
                    wc = w.to(c.dtype).reshape(-1, *([1] * (c.dim() - 1)))
                    total += (c * wc).sum(0).to(p.dtype)
            p.grad = total if p.grad is None else p.grad + total


def _dense_dtype(c: MatrixContribution) -> torch.dtype:
    for f in (c.left, c.right):
        if isinstance(f, torch.Tensor):
            return f.dtype
    raise AssertionError("a contribution has at least one dense factor")
