"""Per-sample independence check: a sample's loss and gradient norm must not depend on the
other samples of its batch.

Per-sample clipping bounds each example's influence only if sample i's gradient is a function of
sample i alone. Layouts and layers that mix samples break that silently: a Linear applied to a
sequence-first ``(T, B, d)`` activation (indistinguishable by shape when T == B), batch
statistics (BatchNorm in training mode, even frozen), or custom code that pools over the batch.
No shape rule catches them all, so the engine compares, once, on the first logical batch with
at least two samples: the exact per-sample losses and gradient norms of its first two samples
computed together, against each sample computed alone. Cost: three exact norm passes on one or
two samples, once per engine.

While it runs, ``nn.Dropout``-family modules are put in eval mode (their masks would differ
between the runs), buffers (e.g. BatchNorm running statistics) and the global RNG state are
restored afterwards, and nothing is left in ``.grad``. A forward that is random beyond
``nn.Dropout`` is detected (two identical runs differ) and reported.
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


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance for batched vs. single-sample results (BLAS reorderings only)."""
    if dtype == torch.float64:
        return 1e-7
    if dtype == torch.float32:
        return 1e-3
    return 5e-2  # float16 / bfloat16


@contextmanager
def _quiet_model(model: nn.Module) -> Iterator[None]:
    dropouts = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    modes = [m.training for m in dropouts]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        for m in dropouts:
            m.eval()
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        for m, mode in zip(dropouts, modes):
            m.train(mode)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def _exact(hooks: PerSampleHooks, loss_fn: Callable, batch: Any) -> tuple[torch.Tensor, ...]:
    _, result = hooks.norm_pass(
        loss_fn, batch, method="exact", k=2, generator_for=lambda device: None,
        retain_graph=False, keep_contributions=False,
    )
    return result.losses.double(), result.sq_norms.clamp(min=0).sqrt().double()


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    scale = torch.maximum(a.abs(), b.abs())
    ok = (a - b).abs() <= rtol * scale + 1e-30
    same_nonfinite = ~torch.isfinite(a) & ~torch.isfinite(b)
    return bool((ok | same_nonfinite).all())


def check_sample_independence(hooks: PerSampleHooks, loss_fn: Callable, batch: Any) -> None:
    """Raise :class:`SampleMixingError` unless samples 0 and 1 of ``batch`` get the same exact
    loss and gradient norm in a batch of two as alone. ``batch`` has at least two samples."""
    model = hooks.model
    dtype = next((p.dtype for p in hooks.params.values()), torch.float32)
    rtol = tolerance(dtype)
    plan, hooks.plan = hooks.plan, {}
    try:
        with _quiet_model(model):
            pair = select_samples(batch, torch.arange(2))
            pair_loss, pair_norm = _exact(hooks, loss_fn, pair)  # its errors are the user's
            try:
                alone = [_exact(hooks, loss_fn, select_samples(batch, torch.tensor([i])))
                         for i in range(2)]
            except (ValueError, RuntimeError) as exc:
                raise SampleMixingError(
                    "the per-sample independence check could evaluate the model on a batch of "
                    f"two samples but not on each sample alone: {exc}. dprc needs "
                    "batch-first layouts in which each sample is computed independently "
                    "(no sequence-first activations, no batch statistics)"
                ) from exc
            single_loss = torch.cat([a[0] for a in alone])
            single_norm = torch.cat([a[1] for a in alone])
            if _close(pair_loss, single_loss, rtol) and _close(pair_norm, single_norm, rtol):
                return
            again_loss, again_norm = _exact(hooks, loss_fn, pair)
            if not (_close(pair_loss, again_loss, rtol) and _close(pair_norm, again_norm, rtol)):
                raise SampleMixingError(
                    "the per-sample independence check found the model's forward random "
                    "beyond nn.Dropout (two identical runs differ), so it cannot compare a "
                    "batch with single samples; make the forward deterministic for the check, "
                    "or, once you know samples do not mix, pass check_independence=False"
                )
    finally:
        hooks.plan = plan
    raise SampleMixingError(
        "samples are not independent: per-sample losses / exact gradient norms of two samples "
        f"computed together ({_fmt(pair_loss)} / {_fmt(pair_norm)}) differ from each computed "
        f"alone ({_fmt(single_loss)} / {_fmt(single_norm)}). Per-sample clipping would not "
        "bound each example's influence. Typical causes: sequence-first activations "
        "(T, B, d) (use batch_first=True layouts), BatchNorm or other batch statistics in "
        "training mode, code that pools over the batch"
    )


def _fmt(x: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in x.tolist()) + "]"
