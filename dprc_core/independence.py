"""Per-sample independence check: a sample's loss and gradient must not depend on the other
samples of its batch.

Per-sample clipping bounds each example's influence only if sample i's gradient is a function of
sample i alone. Layouts and layers that mix samples break that silently: a Linear applied to a
sequence-first ``(T, B, d)`` activation (indistinguishable by shape when T == B), an output with
no batch dimension at all (T5's (T, T, heads) position bias, read as "flattened" when T % B == 0),
batch statistics (BatchNorm in training mode, even frozen), or custom code that pools over the
batch. No shape rule catches them all, so the engine compares, once, on the first logical batch
with at least two samples, its first two samples computed together against each computed alone:

* the **layout** of every hooked call: the same modules in the same order, each giving a sample
  the same per-sample shape (an output without a batch dimension fails here whatever the dtype);
* the per-sample **losses** and whole gradient norms;
* the gradient norm of **every parameter**, measured against the sample's whole gradient norm
  (a mixing that touches one small parameter, like a position bias, is not hidden by the rest).

The check runs in **float64**: every floating parameter and buffer is cast to float64 for its
duration and cast back exactly afterwards (the same tensors), and floating inputs are cast too.
So its tolerance (1e-7 relative) sits far below any error that matters, whatever the training
dtype — in float32 or bfloat16 a loose tolerance let norm errors of 1e-4 pass. Cost: three norm
passes on one or two samples, once per engine, with the model's parameters held in float64
meanwhile (8 bytes per parameter at the peak). The norms use the engine's own norm plan (no
exact norms where the engine sketches) with one fixed projection seed for all runs, which makes
a sketched norm a deterministic function of the sample; the projections are not the training
ones (no privacy cost).

While it runs, the model is in eval mode (dropout masks would differ between the runs) except
batch-statistics layers (BatchNorm), which keep their mode; buffers (e.g. BatchNorm running
statistics) and the global RNG state are restored afterwards, and nothing is left in
``.grad``. A custom module that mixes samples only in training mode is not seen by the check.
A forward that is random even in eval mode is detected (two identical runs differ) and
reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from dprc_core.batching import select_samples
from dprc_core.hooks import PerSampleHooks


class SampleMixingError(RuntimeError):
    """A sample's loss or gradient depends on the other samples of its batch."""


# The check runs in float64 (see the module docstring), where batched and single-sample
# results differ only by BLAS reorderings and by float32 steps some layers take internally.
RTOL = 1e-7


def _float_tensors(model: nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in (*model.parameters(), *model.buffers()):
        if t.is_floating_point() and t.dtype != torch.float64:
            seen.setdefault(id(t), t)
    return list(seen.values())


@contextmanager
def _in_float64(model: nn.Module) -> Iterator[None]:
    """Every floating parameter and buffer in float64 for the duration (same objects: hooks and
    optimizer stay attached), cast back to its own dtype afterwards — exactly, since float64
    holds every float32 / bfloat16 / float16 value."""
    tensors = [(t, t.dtype) for t in _float_tensors(model)]
    try:
        for t, _ in tensors:
            t.data = t.data.to(torch.float64)
        yield
    finally:
        for t, dtype in tensors:
            t.data = t.data.to(dtype)


def _to_float64(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.double() if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return type(batch)({k: _to_float64(v) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_to_float64(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_float64(v) for v in batch)
    return batch


# Modules whose training mode mixes samples (batch statistics): kept in their own mode.
BATCH_STATISTICS: tuple[type, ...] = (nn.modules.batchnorm._BatchNorm,)


@contextmanager
def _quiet_model(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout: nn.Dropout modules and the functional attention dropout of
    Hugging Face models alike), except batch-statistics layers, which stay as they were."""
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        model.eval()
        for m, mode in modes:
            if isinstance(m, BATCH_STATISTICS):
                m.train(mode)
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        for m, mode in modes:
            m.train(mode)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


_CHECK_SEED = 0x5EED


def _fixed_generator(device: torch.device, _name: str = "") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(_CHECK_SEED)


class _Pass:
    """One norm pass of the check: losses, total norms, per-parameter norms, call layouts."""

    def __init__(self, hooks: PerSampleHooks, loss_fn: Callable, batch: Any, method: str, k: int):
        _, result = hooks.norm_pass(
            loss_fn,
            batch,
            method=method,
            k=k,
            generator_for=_fixed_generator,
            retain_graph=False,
            keep_contributions=False,
            record_layouts=True,
        )
        self.loss = result.losses.double()
        self.norm = result.sq_norms.clamp(min=0).sqrt().double()
        self.per_parameter = {
            n: v.clamp(min=0).sqrt().double() for n, v in result.per_parameter.items()
        }
        self.layouts = result.layouts


def _close(
    a: torch.Tensor,
    b: torch.Tensor,
    rtol: float,
    scale: torch.Tensor | None = None,
) -> bool:
    scale = torch.maximum(a.abs(), b.abs()) if scale is None else scale
    ok = ((a - b).abs() <= rtol * scale + 1e-30) | (a == b)
    same_nonfinite = ~torch.isfinite(a) & ~torch.isfinite(b)
    return bool((ok | same_nonfinite).all())


def _layout_mismatch(pair: _Pass, alone: list[_Pass]) -> str | None:
    """Why the hooked calls of the pair and of each sample alone do not line up, if they do
    not: the same modules in the same order, each with the same per-sample shape."""
    for single in alone:
        if [c[0] for c in pair.layouts] != [c[0] for c in single.layouts]:
            return (
                "the hooked modules ran in a different order or number for two samples "
                "than for one sample alone"
            )
        for (name, layout, shape, per), (_, _, shape1, per1) in zip(pair.layouts, single.layouts):
            if per != per1:
                return (
                    f"module '{name}' returned shape {shape} for a batch of 2 and {shape1} "
                    f"for one sample alone: its leading dimension is not the batch (read "
                    f"as {layout}, a sample's rows would be {per} instead of {per1}); the "
                    "output has no batch dimension or is laid out sequence-first"
                )
    return None


def _parameter_mismatch(pair: _Pass, single_norm: torch.Tensor, alone: list[_Pass]) -> str | None:
    """The parameters whose per-sample gradient norm differs between the pair and alone,
    measured against the sample's whole gradient norm."""
    bad = []
    for name, together in pair.per_parameter.items():
        singles = torch.cat([a.per_parameter.get(name, torch.zeros(1)) for a in alone])
        if not _close(together, singles, RTOL, scale=single_norm):
            bad.append(f"{name}: {_fmt(together)} together, {_fmt(singles)} alone")
    if not bad:
        return None
    return "per-parameter gradient norms differ — " + "; ".join(bad[:5])


def check_sample_independence(
    hooks: PerSampleHooks, loss_fn: Callable, batch: Any, method: str = "exact", k: int = 2
) -> None:
    """Raise :class:`SampleMixingError` unless samples 0 and 1 of ``batch`` get, in a batch of
    two and alone, the same loss, the same gradient norm of every parameter (``method``,
    fixed projections) and the same per-sample layout of every hooked call, all computed in
    float64. ``batch`` has at least two samples."""
    model = hooks.model

    def run(b: Any) -> _Pass:
        return _Pass(hooks, loss_fn, _to_float64(b), method, k)

    with _quiet_model(model), _in_float64(model):
        pair = run(select_samples(batch, torch.arange(2)))  # its errors are the user's
        try:
            alone = [run(select_samples(batch, torch.tensor([i]))) for i in range(2)]
        except (ValueError, RuntimeError, TypeError) as exc:
            raise SampleMixingError(
                "the per-sample independence check could evaluate the model on a batch of "
                f"two samples but not on each sample alone: {exc}. dprc needs "
                "batch-first layouts in which each sample is computed independently "
                "(no sequence-first activations, no batch statistics)"
            ) from exc
        single_loss = torch.cat([a.loss for a in alone])
        single_norm = torch.cat([a.norm for a in alone])
        why = _layout_mismatch(pair, alone)
        if why is None:
            whole = _close(pair.loss, single_loss, RTOL) and _close(pair.norm, single_norm, RTOL)
            parts = _parameter_mismatch(pair, single_norm, alone)
            if whole and parts is None:
                return
            why = "; ".join(
                w
                for w in (
                    None
                    if whole
                    else (
                        f"per-sample losses / gradient norms of two samples computed together "
                        f"({_fmt(pair.loss)} / {_fmt(pair.norm)}) differ from each computed "
                        f"alone ({_fmt(single_loss)} / {_fmt(single_norm)})"
                    ),
                    parts,
                )
                if w
            )
            again = run(select_samples(batch, torch.arange(2)))
            if not (_close(pair.loss, again.loss, RTOL) and _close(pair.norm, again.norm, RTOL)):
                raise SampleMixingError(
                    "the per-sample independence check found the model's forward random in "
                    "eval mode (two identical runs differ), so it cannot compare a "
                    "batch with single samples; make the forward deterministic for the check, "
                    "or, once you know samples do not mix, pass check_independence=False"
                )
    raise SampleMixingError(
        f"samples are not independent: {why}. Per-sample clipping would not "
        "bound each example's influence. Typical causes: sequence-first activations "
        "(T, B, d) (use batch_first=True layouts), outputs shared by the whole batch that the "
        "model reshapes itself, BatchNorm or other batch statistics in training mode, code "
        "that pools over the batch"
    )


def _fmt(x: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in x.tolist()) + "]"
