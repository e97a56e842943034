"""Where the sketches' random projections come from (docs/engine.md, "Sketches").

Two modes, named as in the accountant (:data:`dprc_core.accounting.SKETCHES`):

* ``"shared"``: one projection per parameter per logical batch, for every example of it, drawn
  in parameter order from a ``torch.Generator`` seeded from (seed, step). Accounted with the
  revealed-scale model (docs/accounting.md §2).
* ``"per_example"``: an independent projection per example, per parameter, per step. Example
  ``e``'s j-th draw (Hutch++ draws S, then P) for the parameter named ``name`` at step ``t`` is
  the (n, k) matrix of N(0, 1/k) entries from a generator seeded with
  ``derive_seed(seed, "projections/<t>/<name>/<j>", e)`` — or, in secure mode, from the
  ChaCha20 stream ``root.derive("projections").derive("step", t).derive("parameter:<name>",
  j).derive("example", e)`` — so it depends on
  nothing but (secret, step, parameter, example): not on the other examples, nor on the
  micro-batch or rank the example is in. Accounted with the hidden-scale model
  (docs/accounting.md §10). A tied parameter is one name: one projection per example for its
  summed gradient. ``e`` is the example's index in the data set (``accumulate(...,
  example_ids=)``) or, without ids, its position in the logical batch on its rank.

Memory: B·n·k per draw of a parameter (n its larger dimension), transient: freed once the
parameter's norms are computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dprc_core.accounting.events import (
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    SKETCHES,
    default_sketch,
)
from dprc_core.noise.secure_stream import SecureStream
from dprc_core.seeding import derive_seed

__all__ = [
    "PER_EXAMPLE_SKETCH",
    "SHARED_SKETCH",
    "SKETCHES",
    "ExampleProjections",
    "check_sketch_mode",
    "default_sketch",
    "per_example_source",
    "resolve_sketch",
]


def check_sketch_mode(sketch: object, randomized: bool) -> str:
    """``sketch`` validated for an engine whose norm method is (or is not) randomized."""
    if sketch not in SKETCHES:
        raise ValueError(f"sketch must be one of {SKETCHES}, got {sketch!r}")
    if sketch == PER_EXAMPLE_SKETCH and not randomized:
        raise ValueError(
            "sketch='per_example' needs a randomized norm method (hutch, hutchpp or auto): "
            "exact norms draw no projection"
        )
    return str(sketch)


def resolve_sketch(sketch: object, randomized: bool) -> str:
    """``sketch`` validated (:func:`check_sketch_mode`), or the default when it is ``None``
    (:func:`~dprc_core.accounting.events.default_sketch`: per-example for randomized norm
    methods)."""
    return default_sketch(randomized) if sketch is None else check_sketch_mode(sketch, randomized)


class ExampleProjections:
    """The per-example projections of one parameter in one micro-batch: ``draw`` returns a
    (B, n, k) tensor whose i-th slice is example ``ids[i]``'s next projection."""

    def __init__(
        self,
        *,
        seed: int,
        step: int,
        name: str,
        ids: Sequence[int],
        device: torch.device,
        stream: SecureStream | None = None,
    ):
        self.seed = seed
        self.step = step
        self.name = name
        self.ids = list(ids)
        self.device = device
        self.stream = stream
        self.draws = 0

    def draw(self, n: int, k: int, *, dtype: torch.dtype) -> torch.Tensor:
        j = self.draws
        self.draws += 1
        out = torch.empty(len(self.ids), n, k, dtype=dtype, device=self.device)
        if self.stream is not None:
            base = self.stream.derive("step", self.step).derive(f"parameter:{self.name}", j)
            for i, example in enumerate(self.ids):
                # one Box–Muller normal per entry: projections are not noise (no floating-point
                # attack turns them into a DP release); their secrecy is the stream's key
                values = base.derive("example", example).normal(n * k, terms=1)
                out[i] = values.reshape(n, k).to(device=self.device, dtype=dtype)
        else:
            purpose = f"projections/{self.step}/{self.name}/{j}"
            gen = torch.Generator(device=self.device)
            for i, example in enumerate(self.ids):
                gen.manual_seed(derive_seed(self.seed, purpose, example))
                out[i] = torch.randn(n, k, generator=gen, dtype=dtype, device=self.device)
        return out.mul_(k**-0.5)


def per_example_source(
    seed: int, step: int, ids: Sequence[int], stream: SecureStream | None
) -> Callable[[torch.device, str], ExampleProjections]:
    """``(device, parameter name) -> ExampleProjections`` for one micro-batch of one step."""

    def source(device: torch.device, name: str) -> ExampleProjections:
        return ExampleProjections(
            seed=seed, step=step, name=name, ids=ids, device=torch.device(device), stream=stream
        )

    return source
