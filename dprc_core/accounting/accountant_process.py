"""The accountant's heavy work in a child process of its own: calibrations and history leaves.

A server that plans jobs spends most of a create's CPU in the accountant: with per-example
sketches (the hidden-scale model) a calibration and the job's leaf of its data set's history
cost tens of milliseconds each. In the server's own process that work shares one interpreter
(one GIL) with every request thread, and a burst of creates costs more CPU each than the same
work one at a time (docs/benchmarks/budget.md). An :class:`AccountantProcess` runs it in one
child process instead — spawned, so a fresh interpreter that imports the accountant only
(numpy, scipy, dp_accounting; no torch) — one call at a time in arrival order, and hands the
results back with what the caller's caches need, so that the caller composes none of it again:

* :meth:`AccountantProcess.noise_multiplier` — σ from
  :func:`~dprc_core.accounting.calibration.noise_multiplier`, with ε(σ) recorded in the
  caller's calibration curve (:func:`~dprc_core.accounting.calibration.remember_epsilon`), so
  the plan's ε is read, not composed; use it as the runner of
  :func:`~dprc_core.accounting.calibration.calibrations_run_by` to send a planner's
  calibrations there;
* :meth:`AccountantProcess.build_leaves` — the leaves of new events in a history
  (:func:`~dprc_core.accounting.history.built_leaves`), seeded into the caller's caches
  (:func:`~dprc_core.accounting.history.seed_leaves`): its grid, the events' steps and leaves.

The child runs the same code on the same inputs, so the values are those the caller would have
computed (tests/dprc_core/accounting/test_accountant_process.py compares them bit for bit).
Soundness does not rest on it: any grid gives an upper bound and every leaf is a pessimistic
PLD of its event; a calibration's σ is still one whose composed ε is within the target.

A child whose parent is gone (killed) ends within a second (:func:`_child_start`). A child
that dies (killed, out of memory) fails the call it was running with
``BrokenProcessPool``: the call is sent again to a new child, and if that one dies too it is
computed in the calling thread (the work the caller would have done without a child), with an
error logged each time. A child that cannot be started at all (``OSError``: too many
processes, no memory) has the call computed in the calling thread too, logged; the next call
tries a child again. An error the computation itself raises (a target no σ reaches) is
raised to the caller as it is.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from dprc_core.accounting.accountant import DEFAULT_SETTINGS, AccountingSettings
from dprc_core.accounting.calibration import (
    calibrations_run_by,
    gaussian_epsilon,
    noise_multiplier,
    remember_epsilon,
    runner_event,
)
from dprc_core.accounting.events import PrivacyEvent
from dprc_core.accounting.history import BuiltLeaves, built_leaves, seed_leaves
from dprc_core.accounting.memory import release_if_big

log = logging.getLogger(__name__)

T = TypeVar("T")


PARENT_POLL_SECONDS = 1.0


def _child_start(parent: int) -> None:
    """The child's initializer. SIGTERM and SIGINT are ignored: a supervisor that signals the
    whole process group (systemd's control group, a terminal's Ctrl-C, ``killpg``) stops the
    parent, whose orderly exit then stops the child, without a child killed in the middle of
    its queue (its semaphores reported leaked on the server's log). And a thread ends the child
    once its parent is gone: a parent killed with SIGKILL runs no exit handler, and the child
    holds both ends of its own call queue, so no end of file would ever stop it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(PARENT_POLL_SECONDS)

    threading.Thread(target=watch, name="dprc-parent-watch", daemon=True).start()


def _ready() -> int:
    """Run in a new child: its imports are done once this returns."""
    return os.getpid()


def _calibrate(call: dict[str, Any]) -> tuple[float, float]:
    """σ = noise_multiplier(**call) and its ε (the calibration's own composition of σ), here."""
    try:
        with calibrations_run_by(None):  # this process computes it, whatever its caller set
            sigma = noise_multiplier(**call)
            event = runner_event(sigma, call)
            eps = gaussian_epsilon(event, call["target_delta"], call["settings"])
        return sigma, eps
    finally:
        release_if_big()


def _leaves(
    slots: tuple[PrivacyEvent | None, ...],
    delta: float,
    wanted: tuple[PrivacyEvent, ...],
    settings: AccountingSettings,
) -> BuiltLeaves | None:
    try:
        return built_leaves(slots, delta, wanted, settings)
    finally:
        release_if_big()


class AccountantProcess:
    """One child process for the accountant's calibrations and leaves (module docstring),
    started on first use (or by :meth:`start`); thread-safe: concurrent calls wait their turn
    for the child in arrival order."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """A forked child has none of its parent's processes: it starts its own on first use."""
        self._guard = threading.Lock()
        self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_child_start,
                    initargs=(os.getpid(),),
                )
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._guard:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def start(self) -> None:
        """Start the child now (its imports take about a second) without waiting for it."""
        self._executor().submit(_ready)

    def pid(self) -> int:
        """The child's process id (started if need be)."""
        return self._run(_ready)

    def close(self) -> None:
        """Stop the child (a later call starts another)."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, fn: Callable[..., T], *args: Any) -> tuple[ProcessPoolExecutor, Future[T]]:
        """``fn(*args)`` submitted to the child, and the pool it went to; a pool found broken or
        shut down by another call is replaced once. Raises OSError when no child can be
        started (too many processes, no memory)."""
        for attempt in (1, 2):
            pool = self._executor()
            try:
                return pool, pool.submit(fn, *args)
            except (BrokenProcessPool, RuntimeError):  # broken, or shut down by another call
                self._discard(pool)
                if attempt == 2:
                    raise
            except OSError:
                self._discard(pool)  # the next call starts afresh
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        for attempt in (1, 2):
            try:
                pool, future = self._submit(fn, *args)
            except OSError as exc:
                log.error(
                    "the accountant process could not be started for %s (%s); "
                    "computing it in this process",
                    fn.__name__,
                    exc,
                )
                return fn(*args)
            try:
                return future.result()
            except BrokenProcessPool:
                log.error(
                    "the accountant process died during %s (attempt %d of 2); %s",
                    fn.__name__,
                    attempt,
                    "starting another" if attempt == 1 else "computing it in this process",
                )
                self._discard(pool)
        return fn(*args)

    def noise_multiplier(self, **call: Any) -> float:
        """:func:`~dprc_core.accounting.calibration.noise_multiplier` with these keywords, run
        in the child; ε(σ) is recorded in this process's curve (the plan's ε is then read, not
        composed). A runner for :func:`~dprc_core.accounting.calibration.calibrations_run_by`."""
        call.setdefault("settings", DEFAULT_SETTINGS)
        sigma, eps = self._run(_calibrate, call)
        remember_epsilon(runner_event(sigma, call), call["target_delta"], eps, call["settings"])
        return sigma

    def build_leaves(
        self,
        slots: Sequence[PrivacyEvent | None],
        delta: float,
        wanted: Sequence[PrivacyEvent],
        settings: AccountingSettings = DEFAULT_SETTINGS,
    ) -> None:
        """The leaves of the ``wanted`` events in the history ``slots``, built in the child and
        kept in this process's caches (:func:`~dprc_core.accounting.history.seed_leaves`): a
        later ``epsilon_for_history`` of the history composes only blocks."""
        built = self._run(_leaves, tuple(slots), delta, tuple(wanted), settings)
        if built is not None:
            seed_leaves(built)
