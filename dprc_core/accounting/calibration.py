"""Noise calibration: the smallest σ (to within a relative tolerance) with ε(σ) ≤ target.

:func:`calibrate` searches σ for any family of events given as ``make_event(σ)``;
:func:`noise_multiplier` is the calibration of a Poisson-subsampled Gaussian job.

Calibrations of one Poisson-subsampled Gaussian family (same sample rate, steps, envelope,
k, rank, sketch, δ and accounting settings) share their evaluations: ε(σ) is a pure function
of those, so every (σ, ε) a calibration computed is kept in the family's :class:`EpsilonCurve`
(at most ``CURVE_POINTS`` points, ``CURVES`` families, least recently used dropped) and a later
calibration for another target starts from the tightest bracket the curve already holds.
Thirty creates asking thirty different targets of one plan then cost about two fresh
compositions each instead of six to nine. Nothing is interpolated into the answer: the σ
returned is still one whose ε was composed and does not exceed the target, and σ/(1+rel_tol)
was composed and exceeds it.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from dprc_core.accounting.accountant import DEFAULT_SETTINGS, AccountingSettings, account
from dprc_core.accounting.events import (
    SHARED_SKETCH,
    PrivacyEvent,
    SubsampledGaussianEvent,
    check_delta,
    check_epsilon,
)
from dprc_core.accounting.renamed_keywords import renamed_keyword

SIGMA_MIN = 0.01
SIGMA_MAX = 1e3
REL_TOL_MIN = 1e-9  # below this the bracket hi/lo cannot close in double precision
REL_TOL_MAX = 1.0
MAX_REFINEMENTS = 200  # each halves the bracket at worst: 200 halvings exceed any width


def check_rel_tol(rel_tol: object) -> float:
    """``rel_tol`` must be a finite real in [1e-9, 1] (0 or negative would never terminate)."""
    if (
        not isinstance(rel_tol, (int, float))
        or isinstance(rel_tol, bool)
        or not math.isfinite(rel_tol)
        or not REL_TOL_MIN <= rel_tol <= REL_TOL_MAX
    ):
        raise ValueError(
            f"rel_tol must be a number in [{REL_TOL_MIN:g}, {REL_TOL_MAX:g}], got {rel_tol!r}"
        )
    return float(rel_tol)


def _check_sigma_max(sigma_max: object) -> float:
    if (
        not isinstance(sigma_max, (int, float))
        or isinstance(sigma_max, bool)
        or not math.isfinite(sigma_max)
        or sigma_max <= SIGMA_MIN
    ):
        raise ValueError(f"sigma_max must be a finite number > {SIGMA_MIN}, got {sigma_max!r}")
    return float(sigma_max)


CURVES = 64
CURVE_POINTS = 512


class EpsilonCurve:
    """The (σ, ε) pairs composed so far for one event family, sorted by σ; thread-safe.

    ε(σ) is non-increasing in σ; a point that breaks this (it would mean the accountant's
    discretization is not monotone there) makes :meth:`bracket` ignore the curve rather than
    trust either side."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sigmas: list[float] = []
        self._eps: list[float] = []

    def get(self, sigma: float) -> float | None:
        with self._lock:
            i = bisect.bisect_left(self._sigmas, sigma)
            if i < len(self._sigmas) and self._sigmas[i] == sigma:
                return self._eps[i]
        return None

    def add(self, sigma: float, eps: float) -> None:
        with self._lock:
            i = bisect.bisect_left(self._sigmas, sigma)
            if i < len(self._sigmas) and self._sigmas[i] == sigma:
                return
            if len(self._sigmas) >= CURVE_POINTS:
                return  # full: later calibrations still work, from their own points
            self._sigmas.insert(i, sigma)
            self._eps.insert(i, eps)

    def bracket(self, target: float) -> tuple[float, float] | None:
        """(lo, hi): the largest composed σ with ε > target and the smallest with ε ≤ target,
        when both exist and lo < hi; else None."""
        with self._lock:
            lo = hi = None
            for sigma, eps in zip(self._sigmas, self._eps, strict=True):
                if eps > target:
                    lo = sigma
                elif hi is None:
                    hi = sigma
        if lo is None or hi is None or not lo < hi:
            return None
        return lo, hi

    def __len__(self) -> int:
        return len(self._sigmas)


_CURVES: OrderedDict[Hashable, EpsilonCurve] = OrderedDict()
_CURVES_LOCK = threading.Lock()


def epsilon_curve(family: Hashable) -> EpsilonCurve:
    """The shared curve of one event family (created on first use; LRU of ``CURVES``)."""
    with _CURVES_LOCK:
        curve = _CURVES.get(family)
        if curve is None:
            curve = _CURVES[family] = EpsilonCurve()
            while len(_CURVES) > CURVES:
                _CURVES.popitem(last=False)
        else:
            _CURVES.move_to_end(family)
        return curve


def _log_eps(value: float) -> float | None:
    return math.log(value) if 0 < value < math.inf else None


def _closing_proposal(
    lo: float, hi: float, l_lo: float | None, l_hi: float | None, log_t: float, rel_tol: float
) -> tuple[float, str] | None:
    """A σ that closes the bracket in one composition if the secant's root estimate is right:
    lo·(1 + rel_tol) when the estimated root lies at or below it (then ε there ≤ target makes
    it the answer's hi), or hi/(1 + rel_tol) when the root lies at or above that (ε there >
    target makes it lo) — of the two, the one farther from the estimate — with the side it
    should land on. None when neither applies (or ε is not finite and positive at both
    ends). With a dense curve (the targets
    of a burst of creates, each near its neighbours') this is one composition per target
    instead of two; a wrong estimate costs the composition the secant step would have cost,
    and still moves an end of the bracket."""
    if l_lo is None or l_hi is None or l_lo == l_hi:
        return None
    root = math.log(lo) + (l_lo - log_t) / (l_lo - l_hi) * math.log(hi / lo)
    factor = 1.0 + rel_tol * (1.0 - 1e-9)  # so that the closed bracket passes hi/lo ≤ 1 + rel_tol
    up, down = math.log(lo * factor), math.log(hi / factor)
    best: tuple[float, float, str] | None = None
    if up < math.log(hi) and root <= up:
        best = (up - root, lo * factor, "hi")
    if down > math.log(lo) and root >= down and (best is None or root - down > best[0]):
        best = (root - down, hi / factor, "lo")
    return (best[1], best[2]) if best is not None else None


def _calibrate(
    eps_of: Callable[[float], float],
    target: float,
    rel_tol: float,
    sigma_max: float,
    curve: EpsilonCurve | None = None,
) -> float:
    """Bracket then shrink [lo, hi] with ε(lo) > target ≥ ε(hi) until hi/lo ≤ 1 + rel_tol.

    With a ``curve`` (the family's composed points), every composition is read from and
    added to it, and the bracket starts as the tightest one the curve holds.

    ε(σ) is close to a power law, so proposals come from the secant of log ε against log σ,
    kept strictly inside the bracket; once the bracket is narrow the proposal is nudged past
    the estimated root so that both ends close in, and after two updates of the same end a
    geometric bisection step is taken. When the estimated root lies within rel_tol of an end,
    the proposal is the σ that closes the bracket at once (:func:`_closing_proposal`).
    Returns hi, whose ε was evaluated and does not exceed the target.
    """
    cache: dict[float, float] = {}

    def f(sigma: float) -> float:
        if sigma not in cache:
            known = curve.get(sigma) if curve is not None else None
            cache[sigma] = eps_of(sigma) if known is None else known
            if curve is not None and known is None:
                curve.add(sigma, cache[sigma])
        return cache[sigma]

    log_t = math.log(target)
    lo: float | None = None
    hi: float | None = None
    sigma, slope = 1.0, -2.0
    prev: tuple[float, float] | None = None
    known_bracket = curve.bracket(target) if curve is not None else None
    if known_bracket is not None:
        lo, hi = known_bracket
    for _ in range(0 if known_bracket is not None else 60):
        e = f(sigma)
        le = _log_eps(e)
        if prev is not None and le is not None and sigma != prev[0]:
            slope = (le - prev[1]) / (math.log(sigma) - math.log(prev[0]))
            slope = min(max(slope, -8.0), -0.3)
        if le is not None:
            prev = (sigma, le)
        if e <= target:
            hi = sigma
            if lo is not None:
                break
            if sigma <= SIGMA_MIN:
                raise ValueError(
                    f"target epsilon {target} is reached even with noise multiplier "
                    f"{SIGMA_MIN}; the calibration range is [{SIGMA_MIN}, {sigma_max}]"
                )
            factor = 0.5 if le is None else math.exp((log_t - le) / slope) * 0.98
            sigma = max(SIGMA_MIN, sigma * min(max(factor, 1 / 64), 0.98))
        else:
            lo = sigma
            if hi is not None:
                break
            if sigma >= sigma_max:
                raise ValueError(
                    f"no noise multiplier up to {sigma_max:g} achieves epsilon <= {target:g} "
                    "at this delta, sample rate and number of steps"
                )
            factor = 2.0 if le is None else math.exp((log_t - le) / slope) * 1.02
            sigma = min(sigma_max, sigma * max(min(factor, 64.0), 1.02))
    if lo is None or hi is None:  # pragma: no cover - 60 power-law jumps cover [0.01, 1e3]
        raise RuntimeError("noise calibration failed to bracket the target epsilon")
    same_side = 0
    last_side = ""
    missed = False
    for _ in range(MAX_REFINEMENTS):
        if hi / lo <= 1.0 + rel_tol:
            break
        l_lo, l_hi = _log_eps(f(lo)), _log_eps(f(hi))
        width = math.log(hi / lo)
        closing = None if missed else _closing_proposal(lo, hi, l_lo, l_hi, log_t, rel_tol)
        if closing is not None:
            frac = math.log(closing[0] / lo) / width
        elif same_side >= 2 or l_lo is None or l_hi is None or l_lo == l_hi:
            frac = 0.5
        else:
            frac = (l_lo - log_t) / (l_lo - l_hi)
            if width < 0.1:  # aim just past the root, on the side not updated last
                nudge = 0.3 * math.log1p(rel_tol) / width
                frac += nudge if last_side != "hi" else -nudge
            frac = min(max(frac, 0.02), 0.98)
        sigma = closing[0] if closing is not None else lo * math.exp(frac * width)
        side = "hi" if f(sigma) <= target else "lo"
        # a closing proposal on the wrong side of the root: the next step is the secant's
        missed = closing is not None and side != closing[1]
        if side == "hi":
            hi = sigma
        else:
            lo = sigma
        same_side = same_side + 1 if side == last_side else 1
        if frac == 0.5:
            same_side = 0
        last_side = side
    else:  # pragma: no cover - MAX_REFINEMENTS halvings close any bracket in double precision
        raise RuntimeError(f"noise calibration did not reach rel_tol={rel_tol:g}")
    return hi


def calibrate(
    make_event: Callable[[float], PrivacyEvent],
    target_epsilon: float,
    target_delta: float,
    *,
    rel_tol: float = 0.005,
    sigma_max: float = SIGMA_MAX,
    settings: AccountingSettings = DEFAULT_SETTINGS,
    family: Hashable | None = None,
) -> float:
    """Smallest σ (within a relative ``rel_tol``) whose event ``make_event(σ)`` has ε at
    ``target_delta`` at most ``target_epsilon`` (ε by :func:`account`).

    ``make_event(1.0)`` is built once before the search, so an invalid event family is refused
    before any ε is computed. Raises ``ValueError`` if even ``sigma_max`` does not reach the
    target. ``family``: a key naming everything ``make_event`` depends on besides σ; when
    given, compositions are shared with every calibration of the same family, δ and settings
    (:func:`epsilon_curve`). Give it only when that is true.
    """
    target = check_epsilon(target_epsilon)
    delta = check_delta(target_delta)
    rel_tol = check_rel_tol(rel_tol)
    sigma_max = _check_sigma_max(sigma_max)
    make_event(1.0)  # validate the rest

    def eps_of(sigma: float) -> float:
        return account([make_event(sigma)], delta, settings).epsilon

    curve = epsilon_curve((family, delta, settings)) if family is not None else None
    return _calibrate(eps_of, target, rel_tol, sigma_max, curve)


@renamed_keyword("clipping", "envelope")
def noise_multiplier(
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    envelope: str = "exact",
    k: int | None = None,
    rank: int | None = None,
    *,
    sketch: str = SHARED_SKETCH,
    scale_width: float | None = None,
    rel_tol: float = 0.005,
    sigma_max: float = SIGMA_MAX,
    settings: AccountingSettings = DEFAULT_SETTINGS,
    clipping: str | None = None,
) -> float:
    """Smallest σ (within a relative ``rel_tol``) whose ε at ``target_delta`` is ≤ target,
    for ``steps`` Poisson-subsampled Gaussian steps (:class:`SubsampledGaussianEvent`).

    The returned σ satisfies ``epsilon(σ, …) ≤ target_epsilon`` exactly as computed by
    :func:`dprc_core.accounting.epsilon`, and ``epsilon(σ / (1 + rel_tol), …)`` exceeds it.
    Raises ``ValueError`` if even ``sigma_max`` does not reach the target. ``envelope``:
    ``exact`` | ``hutch`` | ``hutchpp`` (with ``k`` and, for hutch, ``rank``); ``sketch``:
    ``"shared"`` (the revealed-scale model) or ``"per_example"`` (the hidden-scale model of
    independent per-example sketches, randomized envelopes only; docs/accounting.md §10);
    ``scale_width``: the hidden-scale law's bin width (per-example sketches only; None: the
    current law, :data:`~dprc_core.accounting.events.HIDDEN_SCALE_WIDTH`). ``clipping``: the
    deprecated name of ``envelope``.
    """

    call: dict[str, Any] = {
        "target_epsilon": target_epsilon,
        "target_delta": target_delta,
        "sample_rate": sample_rate,
        "steps": steps,
        "envelope": envelope,
        "k": k,
        "rank": rank,
        "sketch": sketch,
        "scale_width": scale_width,
        "rel_tol": rel_tol,
        "sigma_max": sigma_max,
        "settings": settings,
    }

    def make_event(sigma: float) -> SubsampledGaussianEvent:
        return runner_event(sigma, call)

    try:
        family: Hashable | None = _gaussian_family(make_event(1.0))
    except ValueError:
        family = None  # calibrate refuses it, after its own checks
    runner = _RUNNER.get()
    if runner is not None and family is not None:
        return runner(**call)
    return calibrate(
        make_event,
        target_epsilon,
        target_delta,
        rel_tol=rel_tol,
        sigma_max=sigma_max,
        settings=settings,
        family=family,
    )


GaussianRunner = Callable[..., float]
"""Runs :func:`noise_multiplier` with these keywords elsewhere and returns its σ (e.g.
:meth:`dprc_core.accounting.accountant_process.AccountantProcess.noise_multiplier`)."""


def runner_event(sigma: float, call: Mapping[str, Any]) -> SubsampledGaussianEvent:
    """The event that :func:`noise_multiplier` called with the keywords ``call`` calibrates,
    at noise multiplier ``sigma`` (what a :data:`GaussianRunner` records its σ's ε under)."""
    return SubsampledGaussianEvent(
        sigma,
        call["sample_rate"],
        call["steps"],
        call["envelope"],
        call["k"],
        call["rank"],
        call["sketch"],
        call["scale_width"],
    )


_RUNNER: ContextVar[GaussianRunner | None] = ContextVar("dprc_gaussian_runner", default=None)


@contextmanager
def calibrations_run_by(runner: GaussianRunner | None) -> Iterator[None]:
    """Within the block (this thread or task), :func:`noise_multiplier` calls — the planner's
    among them — are run by ``runner`` (None: here), given every argument as a keyword."""
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)


def remember_epsilon(
    event: SubsampledGaussianEvent,
    delta: float,
    eps: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> None:
    """Record ``eps`` as the ε of ``event`` at ``delta`` in its family's curve, as computed by
    :func:`gaussian_epsilon` (in another process): a later :func:`gaussian_epsilon` or
    calibration of the family reads it instead of composing it."""
    curve = epsilon_curve((_gaussian_family(event), check_delta(delta), settings))
    curve.add(event.noise_multiplier, eps)


def _gaussian_family(event: SubsampledGaussianEvent) -> Hashable:
    """Everything ``event``'s ε depends on besides σ (its hidden-scale law included)."""
    e = event
    return (
        SubsampledGaussianEvent,
        e.sample_rate,
        e.steps,
        e.envelope,
        e.k,
        e.rank,
        e.sketch,
        e.scale_width,
    )


def gaussian_epsilon(
    event: SubsampledGaussianEvent,
    delta: float,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> float:
    """ε of one Poisson-subsampled Gaussian event at ``delta`` (as :func:`account`), read
    from its family's curve when a calibration already composed it (the planned ε of a
    calibrated plan costs no second composition)."""
    family = _gaussian_family(event)
    curve = epsilon_curve((family, check_delta(delta), settings))
    known = curve.get(event.noise_multiplier)
    if known is not None:
        return known
    eps = account([event], delta, settings).epsilon
    curve.add(event.noise_multiplier, eps)
    return eps


def calibrate_composed(
    make_events: Callable[[float], Sequence[PrivacyEvent]],
    target_epsilon: float,
    target_delta: float,
    *,
    rel_tol: float = 0.005,
    sigma_max: float = SIGMA_MAX,
    settings: AccountingSettings = DEFAULT_SETTINGS,
) -> float:
    """Smallest σ (within a relative ``rel_tol``) whose events ``make_events(σ)``, composed,
    have ε at ``target_delta`` at most ``target_epsilon``: :func:`calibrate` for a mechanism
    whose σ is one of several releases of the same data (the others' events do not depend on
    σ). Raises ``ValueError`` if even ``sigma_max`` does not reach the target."""
    target = check_epsilon(target_epsilon)
    delta = check_delta(target_delta)
    rel_tol = check_rel_tol(rel_tol)
    sigma_max = _check_sigma_max(sigma_max)
    make_events(1.0)  # validate the rest

    def eps_of(sigma: float) -> float:
        return account(list(make_events(sigma)), delta, settings).epsilon

    return _calibrate(eps_of, target, rel_tol, sigma_max)
