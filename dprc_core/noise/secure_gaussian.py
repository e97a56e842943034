"""Independent Gaussian noise N(0, σ²C²) from the secure stream (secure mode).

Same interface as :class:`dprc_core.noise.GaussianNoise` — ``sample(index, like, generator)``
once per parameter per logical batch, then ``end_step()`` — but the ``generator`` argument is
**ignored**: the noise comes from ChaCha20 (:mod:`dprc_core.noise.secure_stream`), not from
torch. It is generated in float64 with the sum-of-normals defence and cast to the parameter's
dtype, then moved to its device.

**Addressing.** The noise of parameter ``index`` at step ``t`` is stream ``index`` under the key
HMAC(noise key, "step/t"), from position 0: it depends on (key, t, index, number of elements)
only — not on the order of the calls, on other parameters, or on whether it was prefetched. The
noise key is HMAC(root key, "noise/rank"): ranks sharing a root key draw disjoint, independent
shards.

**Prefetch** (``prefetch=True``): the noise is independent of the data, so a background thread
generates step t + 1's noise for the parameters sampled at step t (or those given to
:meth:`expect`) while step t + 1's gradients are computed. Memory: one step of noise ahead,
in the parameters' dtypes, on the CPU. ``sample`` waits for it if it is not ready (that wait is
the cost left on the critical path; :attr:`waited_s` sums it). A parameter whose shape or dtype
differs from the one prefetched, or that was not prefetched although the step was, is
generated synchronously — the values are the same, since they are addressed — and counted in
:attr:`prefetch_misses`. Without :meth:`expect` the first step is synchronous. :meth:`close`
stops the thread (the engine's owner calls it; never calling it is safe too: the thread idles
between steps and Python joins it at exit, after at most one step of generation).

**Resume.** :meth:`state_dict` is the noise key, the step and the settings; prefetching never
changes it (the stream position of step t is fixed by t), so a resumed run draws exactly the
noise an uninterrupted one would have. The state holds the **key**: SECRET, like the data.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from dprc_core.noise.secure_stream import DEFAULT_TERMS, STATE_VERSION, SecureStream, check_terms

_Layout = tuple[tuple[int, torch.Size, torch.dtype], ...]


class SecureGaussianNoise:
    """``std · N(0, 1)`` per coordinate from ChaCha20, once per logical batch.

    ``stream``: the root :class:`SecureStream` (None: a fresh OS key); ``rank``: this process's
    shard; ``terms``: normals summed per coordinate (the floating-point defence, ≥ 2 advised);
    ``prefetch``: generate the next step's noise in a background thread."""

    def __init__(
        self,
        std: float,
        *,
        stream: SecureStream | None = None,
        rank: int = 0,
        terms: int = DEFAULT_TERMS,
        prefetch: bool = False,
    ):
        if not (isinstance(std, numbers.Real) and math.isfinite(std) and std >= 0):
            raise ValueError(f"noise std must be a finite number >= 0, got {std!r}")
        self.std: float = float(std)
        self.terms: int = check_terms(terms)
        self.rank: int = int(rank)
        self._noise: SecureStream = (SecureStream() if stream is None else stream).derive(
            "noise", self.rank
        )
        self.step: int = 0
        self.prefetch: bool = bool(prefetch)
        self.waited_s: float = 0.0
        self.prefetch_misses: int = 0
        self._seen: dict[int, tuple[torch.Size, torch.dtype]] = {}
        self._layout: _Layout | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future[dict[int, torch.Tensor]]] | None = None
        self._ready: dict[int, torch.Tensor] = {}
        self._prefetched: bool = False  # whether this step's noise was generated ahead

    # -- generation -----------------------------------------------------------------------------
    def _stream(self, step: int, index: int) -> SecureStream:
        return self._noise.derive("step", step).at(index)

    def generate(
        self, step: int, index: int, shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        """The noise of parameter ``index`` at ``step`` as a new CPU tensor (what ``sample``
        returns, before the move to the parameter's device)."""
        out = torch.empty(tuple(shape), dtype=dtype)
        self._stream(step, index).normal_into(out, terms=self.terms, std=self.std)
        return out

    def _generate_step(self, step: int, layout: _Layout) -> dict[int, torch.Tensor]:
        return {i: self.generate(step, i, shape, dtype) for i, shape, dtype in layout}

    # -- prefetch -------------------------------------------------------------------------------
    def expect(self, tensors: Sequence[torch.Tensor]) -> None:
        """Declare the parameters (index = position in ``tensors``) and, with prefetch, start
        generating the current step's noise now (else it starts after the first step)."""
        self._layout = tuple((i, t.shape, t.dtype) for i, t in enumerate(tensors))
        self._launch(self.step)

    def _launch(self, step: int) -> None:
        if not self.prefetch or self.std == 0 or self._layout is None:
            return
        if self._pending is not None and self._pending[0] == step:
            return
        self._cancel()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dprc-noise")
        self._pending = (step, self._executor.submit(self._generate_step, step, self._layout))

    def _take_prefetched(self) -> None:
        """Wait for the pending step's noise (if it is this step's) and make it available."""
        if self._pending is None or self._pending[0] != self.step:
            return
        start = time.perf_counter()
        ready = self._pending[1].result()
        self.waited_s += time.perf_counter() - start
        self._pending = None
        self._ready = ready
        self._prefetched = True

    def _cancel(self) -> None:
        if self._pending is not None:
            future = self._pending[1]
            if not future.cancel():
                future.result()  # bounded: at most one step of generation
            self._pending = None
        self._ready = {}
        self._prefetched = False

    def close(self) -> None:
        """Stop prefetching (for good) and release the thread and the prefetched noise."""
        self.prefetch = False
        self._cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> SecureGaussianNoise:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the interface the engine uses ----------------------------------------------------------
    def sample(
        self, index: int, like: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor | None:
        """Noise for parameter ``index`` at the current step (shape, dtype, device of
        ``like``); None when std = 0. ``generator`` is ignored (kept for the interface)."""
        if index in self._seen:
            raise RuntimeError(f"parameter index {index} sampled twice in step {self.step}")
        self._seen[index] = (like.shape, like.dtype)
        if self.std == 0:
            return None
        self._take_prefetched()
        noise = self._ready.pop(index, None)
        if noise is None or noise.shape != like.shape or noise.dtype != like.dtype:
            if self._prefetched:
                self.prefetch_misses += 1
            noise = self.generate(self.step, index, like.shape, like.dtype)
        return noise.to(like.device)

    def end_step(self) -> None:
        """Advance to the next step; with prefetch, start generating its noise."""
        if self.prefetch and self._seen:
            layout = tuple((i, shape, dtype) for i, (shape, dtype) in sorted(self._seen.items()))
            self._layout = layout
        self._seen = {}
        self._ready = {}
        self._prefetched = False
        self.step += 1
        self._launch(self.step)

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Noise key, step and settings as flat tensors (safetensors-able); between steps only.
        SECRET: the key regenerates all the noise of this rank."""
        if self._seen:
            raise RuntimeError("state_dict() in the middle of a step; call end_step() first")
        stream = self._noise.state_dict()
        return {
            "meta.version": torch.tensor(STATE_VERSION, dtype=torch.int64),
            "meta.step": torch.tensor(self.step, dtype=torch.int64),
            "meta.std": torch.tensor(self.std, dtype=torch.float64),
            "meta.terms": torch.tensor(self.terms, dtype=torch.int64),
            "meta.rank": torch.tensor(self.rank, dtype=torch.int64),
            "key": stream["key"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; ``std``, ``terms`` and ``rank`` must match."""
        try:
            version = int(state["meta.version"])
            step = int(state["meta.step"])
            std, terms = float(state["meta.std"]), int(state["meta.terms"])
            rank = int(state["meta.rank"])
            key = bytes(torch.as_tensor(state["key"], dtype=torch.uint8).tolist())
        except KeyError as exc:
            raise ValueError(f"not a SecureGaussianNoise state: missing {exc}") from exc
        if version != STATE_VERSION:
            raise ValueError(f"unsupported SecureGaussianNoise state version {version}")
        if (std, terms, rank) != (self.std, self.terms, self.rank):
            raise ValueError(
                f"state is for std={std}, terms={terms}, rank={rank}; this instance has "
                f"std={self.std}, terms={self.terms}, rank={self.rank}"
            )
        self._cancel()
        self._noise = SecureStream(key)
        self.step = step
        self._seen = {}
        self._launch(self.step)
