"""ε after each step of a run, from one construction: the curve of a ledger that grows one step
at a time.

A running job's ledger after ``n`` more steps is a fixed list of events (a checkpoint's, or
none) and the event of ``n`` steps of its plan. The accountant (:func:`~dprc_core.accounting.
accountant.account`) answers one such ledger in 0.1–0.5 s: it prepares every event (the
dominating sensitivity scale, the step's loss geometry), chooses the loss grid h and the tail
budget τ from the events, builds the one-step PLD on that grid — the costly part, about 0.6 s
for the hidden-scale model — composes it over the steps and reads ε off the result.
:class:`StepEpsilons` does the preparation, the choice of (h, τ) and the one-step PLD **once**,
for the ledger at the run's last step, and keeps them; ε after ``n`` steps is then one
self-composition of the kept PLD (the Chernoff truncation bounds from its kept log-moment
generating functions, one FFT, its ``n``-th power and one inverse FFT: dp_accounting's
computation, :func:`~dprc_core.accounting.pld_self_compose.self_compose_dense`), the
composition with the fixed events' kept PLD when there are any, and the hockey-stick
divergence (:func:`~dprc_core.accounting.pld_epsilon.epsilon_from_pld`).

**An upper bound at every step.** The value at ``n`` is the ε of a pessimistic PLD of exactly
the ledger's events after ``n`` steps: every one-step PLD is the builder's pessimistic
connect-the-dots PLD (on any grid h it dominates the step's privacy loss), the truncated scale
and loss tails go to +∞ (charged to δ whatever τ is), the composition's truncated mass goes to
+∞ too, so the result is an upper bound on the ε of those ``n`` steps, like the ledger's
(docs/accounting.md, "The live ε"). It is never the value of a later step.

**The ledger's value.** At the last step it is the ledger's computation itself (the same
events, grid, tail budget and code: identical). Before it, the ledger would choose a coarser
grid (h ∝ n^{-1/4}) and a larger τ (``tail_fraction·δ / n``) for fewer steps; the curve keeps
the finer ones of the last step, so the two are two upper bounds on the same ε that differ by
the ledger's discretisation slack only: within :data:`LEDGER_TOLERANCE` relative
(tests/dprc_core/accounting/test_step_epsilons.py), the curve's value nearly always the
smaller.

**ν-DP-FTRL.** A run's first ``n`` steps are one Gaussian mechanism with μ(n) = Δ(n)/σ, its ε
analytic. For the implemented noise the sensitivity is the norm of the earliest participation
pattern (when B⁻¹'s coefficients are non-negative and non-increasing, checked): the first ``n``
entries of that vector for the whole run, so Δ(n) for every ``n`` is one cumulative sum,
rounded up by :data:`~dprc_core.accounting.dpftrl.ROUNDOFF_MARGIN` as the ledger's; ε(n) is
then :func:`~dprc_core.accounting.dpftrl.gaussian_epsilon`, the ledger's formula (equal to
1e-9 relative). Otherwise, and for any other event a fixed list precedes, each value is the
ledger's own (:class:`StepEpsilons` falls back to :func:`epsilon_for_events`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting import dpftrl
from dprc_core.accounting.accountant import (
    DEFAULT_SETTINGS,
    AccountingSettings,
    _merge,
    check_supported,
    choose_grid,
    compositions,
    epsilon_for_events,
    prepare,
)
from dprc_core.accounting.events import NuDPFTRLEvent, PrivacyEvent, check_delta
from dprc_core.accounting.pld_builders import builder_for
from dprc_core.accounting.pld_epsilon import epsilon_from_pld
from dprc_core.accounting.pld_self_compose import (
    chernoff_log_mgfs,
    compose,
    self_compose,
    self_compose_dense,
)

__all__ = ["LEDGER_TOLERANCE", "StepEpsilons"]

# The largest relative difference between the curve's ε after n steps and the ledger's
# (``PrivacyLedger(events after n steps).epsilon(delta)``) the tests accept: the ledger's
# discretisation slack at n, which the grid keeps at a few 0.01 % (module docstring of
# accountant.py, 4); at most 1.4e-4 measured (a 586-step shared-sketch hutch plan).
LEDGER_TOLERANCE = 5e-4


def _with_steps(event: PrivacyEvent, steps: int) -> PrivacyEvent:
    new: PrivacyEvent = replace(cast(Any, event), steps=steps)
    return new


def _merge_into(
    fixed: Sequence[PrivacyEvent], step: PrivacyEvent
) -> tuple[list[PrivacyEvent], int]:
    """The fixed events as the accountant merges them (events equal up to their step counts
    are one, :func:`~dprc_core.accounting.accountant._merge`), less the one ``step`` merges
    with: (the other events, the steps of that one; 0 if none)."""
    key = _with_steps(step, 1)
    others: list[PrivacyEvent] = []
    merged_steps = 0
    for e in _merge(fixed):
        if builder_for(e).mergeable_steps and _with_steps(e, 1) == key:
            merged_steps = e.steps
        else:
            others.append(e)
    return others, merged_steps


@dataclass
class _Pmf:
    """One adjacency direction's one-step PMF, dense, with its Chernoff log-MGFs."""

    pmf: pld_pmf.PLDPmf
    log_mgfs: tuple[np.ndarray, np.ndarray] | None = None

    def self_compose(self, times: int, truncation: float) -> pld_pmf.PLDPmf:
        pmf = self.pmf
        # pylint: disable=protected-access
        if isinstance(pmf, pld_pmf.SparsePLDPmf):
            if pmf.size**times <= pld_pmf._MAX_PMF_SPARSE_SIZE:
                return pmf.self_compose(times, truncation)  # stays sparse, as the accountant
            self.pmf = pmf = pmf.to_dense_pmf()
        assert isinstance(pmf, pld_pmf.DensePLDPmf)
        if self.log_mgfs is None:
            self.log_mgfs = chernoff_log_mgfs(pmf._probs)
        return self_compose_dense(pmf, times, truncation, self.log_mgfs)


class StepEpsilons:
    """ε at δ of the ledger ``fixed + [step × n]`` for every ``n`` in ``[0, steps]``.

    ``step``: the event of one step (a Poisson-subsampled Gaussian step: its ``n``-step event
    is ``step.first_steps(n)``; or a ν-DP-FTRL run, whose first ``n`` steps are its
    :meth:`~PrivacyEvent.first_steps`); ``fixed``: the events before them (a checkpoint's
    ledger), composed with them as the ledger composes them. The one-step PLD and the fixed
    events' composition are built on first use (one accountant call's work); every
    :meth:`epsilon` after that costs one self-composition and one ε. Thread-safe."""

    def __init__(
        self,
        step: PrivacyEvent,
        steps: int,
        delta: float,
        fixed: Sequence[PrivacyEvent] = (),
        settings: AccountingSettings = DEFAULT_SETTINGS,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        self.step = step
        self.steps = steps
        self.delta = check_delta(delta)
        self.fixed = tuple(fixed)
        self.settings = settings
        check_supported([*self.fixed, step])
        self._lock = threading.Lock()
        self._values: dict[int, float] = {}
        self._built = False
        self._mode = self._choose_mode()
        # built on first use
        self._sensitivities: np.ndarray | None = None
        self._pmfs: list[_Pmf] = []
        self._symmetric = True
        self._fixed_pld: PrivacyLossDistribution | None = None
        self._merged_steps = 0
        self._truncation = min(1e-15, 1e-3 * self.delta)

    def _choose_mode(self) -> str:
        builder = builder_for(self.step)
        if builder.mergeable_steps:
            return "pld"
        if not self.fixed and builder.gaussian_mu(self.step) is not None:
            return "analytic"  # one Gaussian mechanism (a ν-DP-FTRL run): ε of μ(n)
        return "ledger"

    def events(self, n: int) -> list[PrivacyEvent]:
        """The ledger's events after ``n`` steps (the fixed ones, then ``n`` steps)."""
        return [*self.fixed, self.step.first_steps(n)] if n else list(self.fixed)

    def epsilon(self, n: int) -> float:
        """An upper bound on ε at δ after ``n`` steps (module docstring)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.steps:
            raise ValueError(f"n must be an integer in [0, {self.steps}], got {n!r}")
        with self._lock:
            if n not in self._values:
                self._values[n] = self._compute(n)
            return self._values[n]

    # -- the computation
    def _compute(self, n: int) -> float:
        if self._mode == "ledger":
            events = self.events(n)
            return epsilon_for_events(events, self.delta, self.settings) if events else 0.0
        if self._mode == "analytic":
            return self._analytic(n)
        return self._pld(n)

    def _analytic(self, n: int) -> float:
        if n == 0:
            return 0.0
        step = self.step
        if isinstance(step, NuDPFTRLEvent):
            if self._sensitivities is None:
                self._sensitivities = _prefix_sensitivities(step, self.steps)
            sens = self._sensitivities
            if sens.size:
                mu = float(sens[n - 1]) / step.noise_multiplier
                return dpftrl.gaussian_epsilon(mu, self.delta)
        # B⁻¹ not monotone, or another Gaussian mechanism: the ledger's own value
        return epsilon_for_events(self.events(n), self.delta, self.settings)

    def _build(self) -> None:
        """The ledger's preparation at the last step: tail budget, grid, the one-step PLD and
        the fixed events' composed PLD on them."""
        others, merged = _merge_into(self.fixed, self.step)
        self._merged_steps = merged
        total_steps = merged + self.steps
        varying = _with_steps(self.step, total_steps) if total_steps else None
        events = [*others, *([varying] if varying is not None else [])]
        tail = self.settings.tail_fraction * self.delta / sum(compositions(e) for e in events)
        prepared = [prepare(e, tail, self.settings) for e in events]
        h = choose_grid(prepared, self.settings)
        fixed_pld: PrivacyLossDistribution | None = None
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            for p in prepared[: len(others)]:
                pld = p.pld(h, tail)
                if p.compositions > 1:
                    pld = self_compose(pld, p.compositions, self._truncation)
                fixed_pld = pld if fixed_pld is None else compose(fixed_pld, pld, self._truncation)
        self._fixed_pld = fixed_pld
        if varying is not None:
            one = prepared[-1].pld(h, tail)
            # pylint: disable=protected-access
            self._symmetric = bool(one._symmetric)
            self._pmfs = [_Pmf(one._pmf_remove)]
            if not self._symmetric:
                self._pmfs.append(_Pmf(one._pmf_add))
        self._built = True

    def _pld(self, n: int) -> float:
        if not self._built:
            self._build()
        times = self._merged_steps + n
        if times == 0:
            fixed = self._fixed_pld
            return 0.0 if fixed is None else epsilon_from_pld(fixed, self.delta)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if times == 1:
                pmfs = [p.pmf for p in self._pmfs]
            else:
                pmfs = [p.self_compose(times, self._truncation) for p in self._pmfs]
            pld = PrivacyLossDistribution(*pmfs)
            if self._fixed_pld is not None:
                pld = compose(self._fixed_pld, pld, self._truncation)
        return epsilon_from_pld(pld, self.delta)


def _prefix_sensitivities(step: NuDPFTRLEvent, steps: int) -> np.ndarray:
    """Δ(n) for n = 1..steps: the sensitivity of the first ``n`` steps of the ν-DP-FTRL run
    ``step`` (``step.first_steps(n)``), rounded up as the ledger's; empty when B⁻¹'s
    coefficients are not non-negative and non-increasing (then the earliest pattern is not
    known to be the largest: the ledger's own search answers)."""
    b = step.min_separation
    c = dpftrl.inverse_coefficients(step.nu, steps, step.bands)
    if not (np.all(c >= 0) and np.all(np.diff(c) <= 0)):
        return np.zeros(0)
    # the earliest pattern 0, b, 2b, ...: its first n entries are those of the run of n steps
    # with ⌈n/b⌉ participations (dpftrl._earliest_pattern_norm, the same sums in the same order)
    v = np.zeros(steps)
    for start in range(0, steps, b):
        v[start:] += c[: steps - start]
    return np.sqrt(np.cumsum(v * v)) * (1.0 + dpftrl.ROUNDOFF_MARGIN)
