"""Per-sample independence check: a sample's loss and gradient norm must not depend on the
other samples of its batch.

Per-sample clipping bounds each example's influence only if sample i's gradient is a function of
sample i alone. Layouts and layers that mix samples break that silently: a Linear applied to a
sequence-first ``(T, B, d)`` activation (indistinguishable by shape when T == B), batch
statistics (BatchNorm in training mode, even frozen), or custom code that pools over the batch.
No shape rule catches them all, so the engine compares, once, on the first logical batch with
at least two samples: the per-sample losses and gradient norms of its first two samples
computed together, against each sample computed alone. The norms use the engine's own norm
plan (so the check never needs more memory than a two-sample step: no exact norms where the
engine sketches) with one fixed projection seed for all runs, which makes a sketched norm a
deterministic function of the sample. Cost: three norm passes on one or two samples, once per
engine; the projections are not the training ones (no privacy cost).

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


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance for batched vs. single-sample results (BLAS reorderings only)."""
    if dtype == torch.float64:
        return 1e-7
    if dtype == torch.float32:
        return 1e-3
    return 5e-2  # float16 / bfloat16


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


def _fixed_generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(_CHECK_SEED)


def _norms(
    hooks: PerSampleHooks, loss_fn: Callable, batch: Any, method: str, k: int
) -> tuple[torch.Tensor, ...]:
    _, result = hooks.norm_pass(
        loss_fn, batch, method=method, k=k, generator_for=_fixed_generator,
        retain_graph=False, keep_contributions=False,
    )
    return result.losses.double(), result.sq_norms.clamp(min=0).sqrt().double()


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    scale = torch.maximum(a.abs(), b.abs())
    ok = (a - b).abs() <= rtol * scale + 1e-30
    same_nonfinite = ~torch.isfinite(a) & ~torch.isfinite(b)
    return bool((ok | same_nonfinite).all())


def check_sample_independence(
    hooks: PerSampleHooks, loss_fn: Callable, batch: Any, method: str = "exact", k: int = 2
) -> None:
    """Raise :class:`SampleMixingError` unless samples 0 and 1 of ``batch`` get the same loss
    and gradient norm (``method``, fixed projections) in a batch of two as alone. ``batch`` has
    at least two samples."""
    model = hooks.model
    dtype = next((p.dtype for p in hooks.params.values()), torch.float32)
    rtol = tolerance(dtype)

    def norms(b: Any) -> tuple[torch.Tensor, ...]:
        return _norms(hooks, loss_fn, b, method, k)

    with _quiet_model(model):
        pair = select_samples(batch, torch.arange(2))
        pair_loss, pair_norm = norms(pair)  # its errors are the user's
        try:
            alone = [norms(select_samples(batch, torch.tensor([i]))) for i in range(2)]
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
        again_loss, again_norm = norms(pair)
        if not (_close(pair_loss, again_loss, rtol) and _close(pair_norm, again_norm, rtol)):
            raise SampleMixingError(
                "the per-sample independence check found the model's forward random in eval "
                "mode (two identical runs differ), so it cannot compare a "
                "batch with single samples; make the forward deterministic for the check, "
                "or, once you know samples do not mix, pass check_independence=False"
            )
    raise SampleMixingError(
        "samples are not independent: per-sample losses / gradient norms of two samples "
        f"computed together ({_fmt(pair_loss)} / {_fmt(pair_norm)}) differ from each computed "
        f"alone ({_fmt(single_loss)} / {_fmt(single_norm)}). Per-sample clipping would not "
        "bound each example's influence. Typical causes: sequence-first activations "
        "(T, B, d) (use batch_first=True layouts), BatchNorm or other batch statistics in "
        "training mode, code that pools over the batch"
    )


def _fmt(x: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in x.tolist()) + "]"
