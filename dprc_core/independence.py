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

Precision. The verdict comes from **float64**: every floating parameter and buffer is cast to
float64 for its duration and cast back exactly afterwards (the same tensors), and floating inputs
are cast too. So its tolerance (1e-7 relative) sits far below any error that matters, whatever
the training dtype — in float32 or bfloat16 a loose tolerance let norm errors of 1e-4 pass. The
norms use the engine's own norm plan (no exact norms where the engine sketches) with one fixed
projection seed for all runs, which makes a sketched norm a deterministic function of the
sample; the projections are not the training ones (no privacy cost).

Memory (issue 30): the check must cost no more than a training step. It runs inside the first
step, before any gradient exists; a full float64 copy broke that twice over:

* **Parameters.** The float64 cast adds ``8 − itemsize`` bytes per floating parameter and
  buffer — the whole model again at twice (float32) or four times (bfloat16) its size, frozen
  weights included (a bfloat16 7B model: 56 GB). What a step adds and the check does not use
  is the *trainable* parameters' gradients. So the check widens the model to float64 only when
  the cast's bytes fit in those gradients' bytes (+1/16, for buffers): float32 models trained
  in full (the cast takes exactly the gradients' 4 bytes), float64 models (nothing to cast).
  Otherwise (bfloat16 models, LoRA on a frozen base) it first **screens** in float32 if widening
  the half-precision tensors fits the same budget, else in the model's own dtypes, with a
  tolerance from the narrowest dtype's machine epsilon, ``min(SCREEN_RTOL_CAP, SCREEN_RTOL_EPS ·
  eps)`` (3e-5 in float32 — 5 % with TF32 matmuls, ``set_float32_matmul_precision("high")``
  — and 5 % in bfloat16). A screen can only *accept*: a layout mismatch
  (shapes, the same in every dtype) refuses as before, and a numeric mismatch — or a screen
  that cannot run — leaves the verdict to the float64 comparison, at float64's memory, but only
  for the models a screen flags.
* **Activations.** Two samples at full length in float64 take twice the activations of a
  float32 step on them (the benchmark Llama at T = 2048, B = 2: a first step 1.5× a steady
  one). No layout or mixing the check looks for is tied to a length, so for a batch of **token
  sequences** (an integer tensor of 2 or more dimensions, and every tensor of 2 or more
  dimensions of one length T along dimension 1) with T ≥ ``2 · SHORT``, when the check widens
  the model, the widened comparison runs on the first ``T_check = SHORT + T % SHORT`` positions
  (32 ≤ T_check < 64: never one of the check's batch sizes 1 and 2, and divisible by 2, 4, …, 32
  exactly when T is, so layouts read from ``T % B`` and models that need a multiple of a block
  length see what they see at full length). A mismatch there refuses: the model mixes samples on
  those inputs. Then the full length is compared in the model's own dtypes (the memory of a step
  on two samples), screening as above: it sees layouts and mixing that arise only past the
  prefix (a sliding window, a code path for long inputs). The full length decides alone, as
  before, when the prefix is not conclusive: the model fails on it (it needs its full length),
  the samples alone fail, or a sample's loss or norm is not finite or its norm is 0 (left
  padding: no loss on the first positions). Other batches (images, features) are compared at
  full length.

So a model the check accepted is never refused, and the check refuses what it refused except
in two narrow cases: a mixing smaller than the screening tolerance on a model whose float64 cast
does not fit in a step's gradients, and, on long token sequences, a mixing smaller than the own
dtype's tolerance that arises only past the prefix.

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


# The verdict comes from float64 (see the module docstring), where batched and single-sample
# results differ only by BLAS reorderings and by float32 steps some layers take internally.
RTOL = 1e-7
# Screening in a narrower dtype (when the float64 cast does not fit): rtol = min(cap, n · eps).
SCREEN_RTOL_EPS = 256
SCREEN_RTOL_CAP = 0.05
# Token sequences longer than 2 · SHORT are checked on their first SHORT + T % SHORT positions.
SHORT = 32
# The float64 (or float32) cast may add the trainable parameters' gradient bytes, + 1/16.
BUDGET_SLACK = 1 / 16


class _Inconclusive(Exception):
    """The short-sequence check could not decide; the full length decides."""


def _float_tensors(model: nn.Module, below: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """The floating parameters and buffers narrower than ``below`` (each tensor once)."""
    size = torch.empty((), dtype=below).element_size()
    seen: dict[int, torch.Tensor] = {}
    for t in (*model.parameters(), *model.buffers()):
        if t.is_floating_point() and t.element_size() < size:
            seen.setdefault(id(t), t)
    return list(seen.values())


def cast_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes that casting every narrower floating parameter and buffer to ``dtype`` adds."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() * (size - t.element_size()) for t in _float_tensors(model, dtype))


def gradient_bytes(hooks: PerSampleHooks) -> int:
    """Bytes of the trainable parameters' gradients: what a training step adds and the check,
    which runs before any exists, does not."""
    return sum(p.numel() * p.element_size() for p in hooks.params.values())


def screening_rtol(model: nn.Module, widen_to: torch.dtype | None = None) -> float:
    """The screening tolerance, ``min(SCREEN_RTOL_CAP, SCREEN_RTOL_EPS · eps)`` and at least
    ``RTOL``, for the narrowest floating dtype of the model's parameters and buffers (after
    widening the narrower ones to ``widen_to``)."""
    floats = [t.dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    if widen_to is not None:
        bits = torch.finfo(widen_to).bits
        floats = [widen_to if torch.finfo(d).bits < bits else d for d in floats]
    eps = max((_eps(d) for d in floats), default=_eps(torch.float32))
    return max(RTOL, min(SCREEN_RTOL_CAP, SCREEN_RTOL_EPS * eps))


# float32 matmuls at a lower precision (torch.set_float32_matmul_precision): TF32 or bfloat16
_MATMUL_EPS = {"highest": 0.0, "high": 2.0**-10, "medium": 2.0**-7}


def _eps(dtype: torch.dtype) -> float:
    """The machine epsilon a dtype computes with (float32 matmuls: at the precision set)."""
    eps = torch.finfo(dtype).eps
    if dtype == torch.float32:
        eps = max(eps, _MATMUL_EPS.get(torch.get_float32_matmul_precision(), 0.0))
    return eps


def check_dtype(hooks: PerSampleHooks) -> tuple[torch.dtype | None, float]:
    """The dtype the check starts in and its tolerance: ``(torch.float64, RTOL)`` when the
    float64 cast fits in a training step's gradient bytes; else a screening dtype —
    ``torch.float32`` (widening half-precision tensors only) or ``None`` (the model's own
    dtypes) — and a tolerance from the narrowest dtype left."""
    budget = gradient_bytes(hooks) * (1 + BUDGET_SLACK)
    model = hooks.model
    if cast_bytes(model, torch.float64) <= budget:
        return torch.float64, RTOL
    if cast_bytes(model, torch.float32) <= budget:
        return torch.float32, screening_rtol(model, torch.float32)
    return None, screening_rtol(model)


@contextmanager
def _widened(model: nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """Every floating parameter and buffer narrower than ``dtype`` cast to it for the duration
    (same objects: hooks and optimizer stay attached), cast back to its own dtype afterwards —
    exactly, since a wider float holds every value of a narrower one. ``None``: no cast."""
    tensors = [] if dtype is None else [(t, t.dtype) for t in _float_tensors(model, dtype)]
    try:
        for t, _ in tensors:
            t.data = t.data.to(dtype)
        yield
    finally:
        for t, old in tensors:
            t.data = t.data.to(old)


def _widen_inputs(batch: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        narrower = batch.is_floating_point() and batch.element_size() < dtype.itemsize
        return batch.to(dtype) if narrower else batch
    if isinstance(batch, dict):
        return type(batch)({k: _widen_inputs(v, dtype) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_widen_inputs(v, dtype) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_widen_inputs(v, dtype) for v in batch)
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors(v)


def sequence_length(batch: Any) -> int | None:
    """T of a batch of token sequences — an integer tensor of 2 or more dimensions, and every
    tensor of 2 or more dimensions of length T along dimension 1 — else None."""
    wide = [t for t in _tensors(batch) if t.dim() >= 2]
    tokens = [
        t for t in wide if not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)
    ]
    lengths = {t.shape[1] for t in wide}
    return lengths.pop() if tokens and len(lengths) == 1 else None


def short_length(t: int) -> int | None:
    """The length the check compares for token sequences of length ``t`` (None: all of it):
    ``SHORT + t % SHORT`` when ``t ≥ 2 · SHORT`` — in [SHORT, 2 · SHORT), never the check's
    batch size, and divisible by each power of two up to SHORT exactly when ``t`` is."""
    return SHORT + t % SHORT if t >= 2 * SHORT else None


def _truncate(batch: Any, t: int, t_check: int) -> Any:
    if isinstance(batch, torch.Tensor):
        if batch.dim() >= 2 and batch.shape[1] == t:
            return batch[:, :t_check].contiguous()
        return batch
    if isinstance(batch, dict):
        return type(batch)({k: _truncate(v, t, t_check) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_truncate(v, t, t_check) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_truncate(v, t, t_check) for v in batch)
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


def _parameter_mismatch(
    pair: _Pass, single_norm: torch.Tensor, alone: list[_Pass], rtol: float
) -> str | None:
    """The parameters whose per-sample gradient norm differs between the pair and alone,
    measured against the sample's whole gradient norm."""
    bad = []
    for name, together in pair.per_parameter.items():
        singles = torch.cat([a.per_parameter.get(name, torch.zeros(1)) for a in alone])
        if not _close(together, singles, rtol, scale=single_norm):
            bad.append(f"{name}: {_fmt(together)} together, {_fmt(singles)} alone")
    if not bad:
        return None
    return "per-parameter gradient norms differ — " + "; ".join(bad[:5])


def _numeric_mismatch(pair: _Pass, alone: list[_Pass], rtol: float) -> str | None:
    """Why the losses, whole norms or per-parameter norms of the pair and of each sample alone
    differ beyond ``rtol``, if they do."""
    single_loss = torch.cat([a.loss for a in alone])
    single_norm = torch.cat([a.norm for a in alone])
    whole = _close(pair.loss, single_loss, rtol) and _close(pair.norm, single_norm, rtol)
    parts = _parameter_mismatch(pair, single_norm, alone, rtol)
    if whole and parts is None:
        return None
    return "; ".join(
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


def _vacuous(pair: _Pass) -> bool:
    """Nothing to compare: a sample's loss or norm is not finite, or its gradient is 0."""
    finite = bool(torch.isfinite(pair.loss).all() and torch.isfinite(pair.norm).all())
    return not finite or bool((pair.norm == 0).any())


class _Check:
    """One comparison of a pair of samples against each alone, in one dtype."""

    def __init__(self, hooks: PerSampleHooks, loss_fn: Callable, method: str, k: int):
        self.hooks, self.loss_fn, self.method, self.k = hooks, loss_fn, method, k

    def run(self, batch: Any, dtype: torch.dtype | None) -> _Pass:
        return _Pass(self.hooks, self.loss_fn, _widen_inputs(batch, dtype), self.method, self.k)

    def compare(
        self,
        pair_batch: Any,
        alone_batches: list[Any],
        dtype: torch.dtype | None,
        rtol: float,
        short: bool,
        tentative: bool,
    ) -> tuple[str | None, str]:
        """(why, kind): why the samples are not independent (None: they are) and whether that
        is a ``layout`` or a ``numeric`` mismatch. In float64 a numeric mismatch is confirmed
        by a second identical run (a random forward is reported as such). ``tentative`` (a
        short sequence, or a screening dtype): a failing run raises :class:`_Inconclusive`
        instead, and so, with ``short``, does a pair with nothing to compare."""
        with _widened(self.hooks.model, dtype):
            if tentative:
                try:
                    pair = self.run(pair_batch, dtype)
                except Exception as exc:  # noqa: BLE001 - the full length / float64 decides
                    raise _Inconclusive from exc
                if short and _vacuous(pair):
                    raise _Inconclusive
            else:
                pair = self.run(pair_batch, dtype)  # its errors are the user's
            try:
                alone = [self.run(b, dtype) for b in alone_batches]
            except (ValueError, RuntimeError, TypeError) as exc:
                if tentative:
                    raise _Inconclusive from exc
                raise SampleMixingError(
                    "the per-sample independence check could evaluate the model on a batch of "
                    f"two samples but not on each sample alone: {exc}. dprc needs "
                    "batch-first layouts in which each sample is computed independently "
                    "(no sequence-first activations, no batch statistics)"
                ) from exc
            why = _layout_mismatch(pair, alone)
            if why is not None:
                return why, "layout"
            why = _numeric_mismatch(pair, alone, rtol)
            if why is None:
                return None, ""
            if dtype == torch.float64:
                again = self.run(pair_batch, dtype)
                if not (
                    _close(pair.loss, again.loss, rtol) and _close(pair.norm, again.norm, rtol)
                ):
                    raise SampleMixingError(
                        "the per-sample independence check found the model's forward random in "
                        "eval mode (two identical runs differ), so it cannot compare a "
                        "batch with single samples; make the forward deterministic for the "
                        "check, or, once you know samples do not mix, pass "
                        "check_independence=False"
                    )
            return why, "numeric"

    def decide(
        self,
        pair_batch: Any,
        alone_batches: list[Any],
        start: torch.dtype | None,
        rtol: float,
        short: bool,
    ) -> None:
        """Screen in ``start`` if it is not float64 (accepts, or refuses a layout), and settle
        everything else in float64. A screen that cannot run leaves the decision to float64
        (on a short sequence: to the full length)."""
        if start != torch.float64:
            try:
                why, kind = self.compare(pair_batch, alone_batches, start, rtol, short, True)
            except _Inconclusive:
                if short:
                    raise
                why, kind = "", "inconclusive"
            if why is None:
                return
            if kind == "layout":
                raise _mixing(why)
        why, _ = self.compare(pair_batch, alone_batches, torch.float64, RTOL, short, short)
        if why is not None:
            raise _mixing(why)


def _mixing(why: str) -> SampleMixingError:
    return SampleMixingError(
        f"samples are not independent: {why}. Per-sample clipping would not "
        "bound each example's influence. Typical causes: sequence-first activations "
        "(T, B, d) (use batch_first=True layouts), outputs shared by the whole batch that the "
        "model reshapes itself, BatchNorm or other batch statistics in training mode, code "
        "that pools over the batch"
    )


def check_sample_independence(
    hooks: PerSampleHooks, loss_fn: Callable, batch: Any, method: str = "exact", k: int = 2
) -> None:
    """Raise :class:`SampleMixingError` unless samples 0 and 1 of ``batch`` get, in a batch of
    two and alone, the same loss, the same gradient norm of every parameter (``method``,
    fixed projections) and the same per-sample layout of every hooked call, decided in
    float64 (see the module docstring for the short sequences and the screening dtype that
    keep its memory within a training step's). ``batch`` has at least two samples."""
    check = _Check(hooks, loss_fn, method, k)
    start, rtol = check_dtype(hooks)
    pair = select_samples(batch, torch.arange(2))
    alone = [select_samples(batch, torch.tensor([i])) for i in range(2)]
    if any(type(p).__name__ == "DTensor" for p in hooks.model.parameters()):
        with _quiet_model(hooks.model):
            _check_sharded(check, pair, alone, hooks.model)
        return
    with _quiet_model(hooks.model):
        t = sequence_length(pair)
        t_check = None if t is None else short_length(t)
        # the prefix serves only a check wider than the model (its own dtypes run in full)
        widens = start is not None and cast_bytes(hooks.model, start) > 0
        if t is not None and t_check is not None and widens:
            try:
                short_alone = [_truncate(b, t, t_check) for b in alone]
                check.decide(_truncate(pair, t, t_check), short_alone, start, rtol, short=True)
            except _Inconclusive:
                pass  # the full length decides, as below
            else:
                # the full length in the model's own dtypes (a training step's memory):
                # layouts and mixing beyond the prefix; a numeric flag is settled in float64
                check.decide(pair, alone, None, screening_rtol(hooks.model), short=False)
                return
        check.decide(pair, alone, start, rtol, short=False)


def _check_sharded(check: _Check, pair: Any, alone: list[Any], model: nn.Module) -> None:
    """A sharded (FSDP2) model cannot be cast for the check: FSDP gathers its parameters into
    buffers of their own dtype (or of its mixed-precision policy's ``param_dtype``, which the
    forward then computes in). A float64 model is decided as usual; another is screened in the
    dtypes it computes in, with their tolerance, which accepts or refuses — what only float64
    could settle is refused, saying so (never accepted)."""
    compute = _sharded_compute_dtypes(model)
    if not _float_tensors(model, torch.float64) and compute <= {torch.float64}:
        check.decide(pair, alone, torch.float64, RTOL, short=False)  # nothing to cast
        return
    eps = max([_eps(d) for d in compute] + [_eps(torch.float32)] * (not compute))
    rtol = max(screening_rtol(model), min(SCREEN_RTOL_CAP, SCREEN_RTOL_EPS * eps))
    try:
        why, _ = check.compare(pair, alone, None, rtol, False, True)
    except _Inconclusive:
        why = "the check could not run in the model's own dtypes"
    if why is None:
        return
    raise SampleMixingError(
        f"{_mixing(why)} — under sharding (FSDP2) the check runs in the model's own dtypes and "
        "cannot be settled in float64; check the unsharded model (or a float64 copy) once, "
        "then pass check_independence=False to the sharded engine"
    )


def _sharded_compute_dtypes(model: nn.Module) -> set[torch.dtype]:
    """The dtypes FSDP2 gathers the parameters into: a mixed-precision policy's
    ``param_dtype`` where one is set, else the parameters' own."""
    dtypes: set[torch.dtype] = set()
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state is not None else None
        policy = getattr(group, "mp_policy", None)
        if policy is not None and policy.param_dtype is not None:
            dtypes.add(policy.param_dtype)
    floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return dtypes or floats


def _fmt(x: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in x.tolist()) + "]"
