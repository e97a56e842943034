"""Per-sample clipping as objects: how the norms are computed and how the clipped sum is formed.

``Clipping(C, norm=...)`` is what a :class:`~dprc_core.engine.PrivacyEngine` clips with:

* ``max_grad_norm``: the clipping norm C (finite, > 0);
* ``norm`` (the *norm method*, how per-sample gradient norms are computed):
  ``Exact()`` (``method``: ``"exact"``, which picks ``fgc`` or ``ghost`` per parameter by
  cost, or one of the two), ``Hutch(k, sketch)`` / ``HutchPP(k, sketch)`` (randomized
  estimates with sketch dimension k ≥ 2) or ``Auto(max_seq_len, k, sketch)`` (exact or
  ``hutch`` per parameter, resolved once for ``max_seq_len`` tokens); ``Sketched(method, k,
  sketch)`` names any other registered randomized method;
* ``clipped_sum`` (how Σ_i c_i g_i is formed): ``"bookkeeping"`` from the stored layer
  factors or per-sample gradients (no second backward), or ``"two_pass"`` by a second
  backward on Σ_i c_i L_i;
* ``check_independence``: run the per-sample independence check on the first batch
  (:mod:`dprc_core.independence`).

A randomized method's ``sketch`` (how its projections are drawn: ``"per_example"`` or
``"shared"``, :mod:`dprc_core.sketches`) left ``None`` is resolved on construction to
:func:`dprc_core.accounting.events.default_sketch`. Every value is validated on construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dprc_core.accounting.events import default_sketch
from dprc_core.mechanism_names import DEFAULT_K
from dprc_core.norm_methods import get_norm_method
from dprc_core.sketches import check_sketch_mode, resolve_sketch

# How the clipped sum is formed: a second backward, or from the stored factors / gradients
CLIPPED_SUMS = ("two_pass", "bookkeeping")

__all__ = [
    "CLIPPED_SUMS",
    "DEFAULT_K",
    "Auto",
    "Clipping",
    "Exact",
    "Hutch",
    "HutchPP",
    "NormChoice",
    "Sketched",
    "check_k",
    "check_max_seq_len",
    "finite_number",
    "norm_from_method",
]


def check_k(k: Any, randomized: bool = False) -> int:
    """The sketch dimension: an integer ≥ 1, ≥ 2 for a randomized norm method."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (sketch dimension) must be an integer >= 1, got {k!r}")
    if randomized and k < 2:
        raise ValueError(
            "k (sketch dimension) must be >= 2 for randomized clipping: the privacy analysis of "
            "the Hutchinson estimate (the chi-square(k)/k envelope, docs/design.md §4) needs "
            f"k >= 2, and the accountant refuses k=1; got k={k!r}"
        )
    return k


def check_max_seq_len(max_seq_len: Any) -> int:
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive integer, got {max_seq_len!r}")
    return max_seq_len


def finite_number(name: str, value: Any, *, positive: bool) -> float:
    """A finite real number (bools refused), > 0 if ``positive`` else >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Exact:
    """Exact per-sample norms: ``method`` ``"exact"`` (``fgc`` or ``ghost`` per parameter,
    by cost), ``"ghost"`` or ``"fgc"``. Draws no projection (sketch ``"shared"``)."""

    method: str = "exact"
    randomized: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if get_norm_method(self.method).randomized:  # raises for an unknown name
            raise ValueError(
                f"Exact(method=...) takes an exact norm method (exact, ghost, fgc), got "
                f"{self.method!r}"
            )

    @property
    def sketch(self) -> str:
        return default_sketch(randomized=False)


def _resolve_sketch(norm: Any) -> None:
    """A randomized norm's ``k`` checked and its ``sketch`` validated or defaulted."""
    check_k(norm.k, randomized=True)
    object.__setattr__(norm, "sketch", resolve_sketch(norm.sketch, randomized=True))


@dataclass(frozen=True)
class Hutch:
    """Hutchinson estimates of the per-sample norms with ``k`` projections (k ≥ 2)."""

    k: int = DEFAULT_K
    sketch: str | None = None  # per_example | shared; None: default_sketch(randomized=True)
    method: ClassVar[str] = "hutch"
    randomized: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _resolve_sketch(self)


@dataclass(frozen=True)
class HutchPP:
    """Hutch++ estimates of the per-sample norms with ``k`` projections (k ≥ 2)."""

    k: int = DEFAULT_K
    sketch: str | None = None  # per_example | shared; None: default_sketch(randomized=True)
    method: ClassVar[str] = "hutchpp"
    randomized: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _resolve_sketch(self)


@dataclass(frozen=True)
class Auto:
    """Exact or ``hutch`` per parameter, resolved once for ``max_seq_len`` tokens per use
    (:func:`dprc_core.estimators.auto_method`) and fixed for the engine's life, so that the
    accounting is known before training."""

    max_seq_len: int
    k: int = DEFAULT_K
    sketch: str | None = None  # per_example | shared; None: default_sketch(randomized=True)
    method: ClassVar[str] = "auto"
    randomized: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_max_seq_len(self.max_seq_len)
        _resolve_sketch(self)


@dataclass(frozen=True)
class Sketched:
    """Any registered randomized norm method by name (``dprc_core.norm_methods``, e.g. one
    added with :func:`~dprc_core.norm_methods.register_norm_method`) with ``k`` projections;
    ``Hutch`` and ``HutchPP`` are the built-in ones, ``Auto`` the dispatcher."""

    method: str
    k: int = DEFAULT_K
    sketch: str | None = None  # per_example | shared; None: default_sketch(randomized=True)
    randomized: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.method == Auto.method:
            raise ValueError("use Auto(max_seq_len, k, sketch) for the auto norm method")
        if not get_norm_method(self.method).randomized:  # raises for an unknown name
            raise ValueError(
                f"Sketched(method=...) takes a randomized norm method, got {self.method!r}; "
                "use Exact(method=...) for exact norms"
            )
        _resolve_sketch(self)


NormChoice = Exact | Hutch | HutchPP | Auto | Sketched
_NORMS = (Exact, Hutch, HutchPP, Auto, Sketched)


@dataclass(frozen=True)
class Clipping:
    """Per-sample clipping to ``max_grad_norm`` with norms from ``norm`` and the clipped sum
    formed by ``clipped_sum`` (see the module docstring)."""

    max_grad_norm: float
    norm: NormChoice = field(default_factory=Hutch)
    clipped_sum: str = "bookkeeping"
    check_independence: bool = True

    def __post_init__(self) -> None:
        c = finite_number("max_grad_norm", self.max_grad_norm, positive=True)
        object.__setattr__(self, "max_grad_norm", c)
        if not isinstance(self.norm, _NORMS):
            raise TypeError(
                "norm must be Exact(), Hutch(k, sketch), HutchPP(k, sketch), "
                f"Auto(max_seq_len, k, sketch) or Sketched(method, k, sketch), got {self.norm!r}"
            )
        if self.clipped_sum not in CLIPPED_SUMS:
            raise ValueError(f"clipped_sum must be one of {CLIPPED_SUMS}, got {self.clipped_sum!r}")
        object.__setattr__(self, "check_independence", bool(self.check_independence))

    @property
    def norm_method(self) -> str:
        """The norm method's registered name (``dprc_core.norm_methods``)."""
        return self.norm.method

    @property
    def randomized(self) -> bool:
        return self.norm.randomized

    @property
    def k(self) -> int:
        """The sketch dimension (the default for exact norms, which draw no projection)."""
        return DEFAULT_K if isinstance(self.norm, Exact) else self.norm.k

    @property
    def sketch(self) -> str:
        """How projections are drawn (``"shared"`` for exact norms: nothing is drawn)."""
        sketch = self.norm.sketch
        assert sketch is not None  # resolved on construction
        return sketch

    @property
    def max_seq_len(self) -> int | None:
        return self.norm.max_seq_len if isinstance(self.norm, Auto) else None

    def to_dict(self) -> dict[str, Any]:
        """This clipping as a JSON object (a service job row's ``privacy.mechanisms.clipping``;
        :meth:`from_dict` builds the equal object back)."""
        return {
            "max_grad_norm": self.max_grad_norm,
            "norm_method": self.norm_method,
            "k": None if isinstance(self.norm, Exact) else self.k,
            "sketch": self.sketch,
            "max_seq_len": self.max_seq_len,
            "clipped_sum": self.clipped_sum,
            "check_independence": self.check_independence,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Clipping:
        """The clipping a :meth:`to_dict` object describes (unknown or missing fields and
        invalid values refused with a ValueError naming them)."""
        if not isinstance(data, dict):
            raise ValueError(f"a clipping must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - set(_CLIPPING_FIELDS)
        missing = {"max_grad_norm", "norm_method"} - set(data)
        if unknown or missing:
            raise ValueError(
                f"clipping fields: unknown {sorted(unknown)}, missing {sorted(missing)}"
            )
        k = data.get("k")
        norm = norm_from_method(
            data["norm_method"],
            k=DEFAULT_K if k is None else k,
            max_seq_len=data.get("max_seq_len"),
            sketch=data.get("sketch"),
        )
        return cls(
            data["max_grad_norm"],
            norm,
            data.get("clipped_sum", "bookkeeping"),
            data.get("check_independence", True),
        )


_CLIPPING_FIELDS = (
    "max_grad_norm",
    "norm_method",
    "k",
    "sketch",
    "max_seq_len",
    "clipped_sum",
    "check_independence",
)


def norm_from_method(
    method: str,
    *,
    k: int = DEFAULT_K,
    max_seq_len: int | None = None,
    sketch: str | None = None,
) -> NormChoice:
    """The norm object for a norm method given by name (a job spec's or the keyword form's
    ``norm_method``, ``k``, ``max_seq_len``, ``sketch``). ``k`` is checked for every method and
    ``max_seq_len`` whenever given, though only randomized methods and ``auto`` use them;
    ``sketch`` with exact norms may only be ``"shared"``."""
    randomized = get_norm_method(method).randomized  # raises for an unknown name
    check_k(k, randomized=randomized)
    if sketch is not None:
        check_sketch_mode(sketch, randomized)
    if max_seq_len is not None:
        check_max_seq_len(max_seq_len)
    if not randomized:
        return Exact(method)
    if method == Auto.method:
        if max_seq_len is None:
            raise ValueError(
                "norm_method='auto' needs max_seq_len (the longest sequence the model will "
                "see): auto resolves exact or hutch once per layer for that length and keeps "
                "it fixed, so that the accounting is known before training"
            )
        return Auto(max_seq_len, k, sketch)
    if method == Hutch.method:
        return Hutch(k, sketch)
    if method == HutchPP.method:
        return HutchPP(k, sketch)
    return Sketched(method, k, sketch)
