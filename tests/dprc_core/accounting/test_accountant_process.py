"""The accountant process (``dprc_core.accounting.accountant_process``, issue 45 part 3) changes
no number and survives its child's death:

* a calibration run in the child gives the σ and ε that the same calibration gives in this
  process from the same (empty) caches, bit for bit, and leaves its ε in this process's curve
  (the plan's ε is then read, not composed);
* leaves built in the child and seeded here give the history ε computed here from scratch, bit
  for bit, and the seeded history composes no step of the new event here;
* a target no σ reaches raises the calibration's own ValueError;
* the child imports no torch;
* a child whose parent is killed ends by itself; a child killed between calls is replaced; a
  child that dies during a call has the call sent to a new one, and when that one dies too the
  call is computed here, each death logged; a child that cannot be started has the call
  computed here, logged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dprc_core.accounting import SubsampledGaussianEvent, calibration, history, noise_multiplier
from dprc_core.accounting import accountant_process as ap
from dprc_core.accounting import subsampled_gaussian_builder as sgb
from dprc_core.accounting.accountant import DEFAULT_SETTINGS
from dprc_core.accounting.calibration import _CURVES, gaussian_epsilon
from tests.call_counts import count_calls

DELTA = 1.3e-3
Q, STEPS = 0.05, 20
HUTCH = {"envelope": "hutch", "k": 32, "sketch": "per_example"}


def _clear() -> None:
    history.clear_cache()
    _CURVES.clear()


@pytest.fixture(scope="module")
def process():
    p = ap.AccountantProcess()
    yield p
    p.close()


def _call(target: float, **kw) -> dict:
    call = {
        "target_epsilon": target,
        "target_delta": DELTA,
        "sample_rate": Q,
        "steps": STEPS,
        "envelope": "exact",
        "k": None,
        "rank": None,
        "sketch": "shared",
        "scale_width": None,
        "rel_tol": 0.005,
        "sigma_max": calibration.SIGMA_MAX,
    }
    call.update(kw)
    return call


@pytest.mark.parametrize("kw", [{}, HUTCH], ids=["exact", "hutch_per_example"])
def test_a_calibration_in_the_child_is_the_one_here(process, kw, monkeypatch):
    target = 1.7
    _clear()
    here = noise_multiplier(target, DELTA, Q, STEPS, **kw)
    event = SubsampledGaussianEvent(
        here, Q, STEPS, kw.get("envelope", "exact"), kw.get("k"), None, kw.get("sketch", "shared")
    )
    eps_here = gaussian_epsilon(event, DELTA)

    process.close()  # a new child: empty caches, as here after _clear
    _clear()
    sigma = process.noise_multiplier(**_call(target, **kw))
    assert sigma == here
    calls = count_calls(monkeypatch, calibration, "account")
    assert gaussian_epsilon(event, DELTA) == eps_here  # read from the curve: nothing composed
    assert calls["account"] == 0
    assert eps_here <= target


def test_the_planner_calibrates_in_the_child_when_asked(process, monkeypatch):
    calls = count_calls(monkeypatch, calibration, "calibrate")
    with calibration.calibrations_run_by(process.noise_multiplier):
        sigma = noise_multiplier(2.3, DELTA, Q, STEPS, "hutch", 32, sketch="per_example")
    assert calls["calibrate"] == 0
    monkeypatch.undo()
    _clear()
    assert sigma == noise_multiplier(2.3, DELTA, Q, STEPS, "hutch", 32, sketch="per_example")


def _older() -> list[SubsampledGaussianEvent | None]:
    older: list[SubsampledGaussianEvent | None] = [
        SubsampledGaussianEvent(4.0 + 0.1 * i, Q, i % STEPS + 1) for i in range(6)
    ]
    older.insert(3, None)  # a job without an event yet
    return older


def test_leaves_from_the_child_give_the_history_computed_here(process, monkeypatch):
    new = SubsampledGaussianEvent(0.9, Q, STEPS, "hutch", 32, None, "per_example")
    slots = [*_older(), new]
    _clear()
    here = history.epsilon_for_history(slots, DELTA)

    process.close()
    _clear()
    process.build_leaves(slots, DELTA, [new])
    steps = count_calls(monkeypatch, sgb, "_one_step")
    pmfs = count_calls(monkeypatch, sgb, "hidden_step_pld")
    assert history.epsilon_for_history(slots, DELTA) == here
    assert steps["_one_step"] == 0  # every step and leaf was seeded
    assert pmfs["hidden_step_pld"] == 0


def test_a_history_without_leaves_builds_none(process):
    _clear()
    process.build_leaves([None, SubsampledGaussianEvent(1.0, Q, STEPS)], DELTA, [])
    assert len(history._CACHE._items) == 0


def test_an_unreachable_target_raises_the_calibrations_error(process):
    with pytest.raises(ValueError, match="no noise multiplier up to 2"):
        process.noise_multiplier(**_call(1e-3, sigma_max=2.0))


def _has_torch() -> bool:
    return "torch" in sys.modules


def test_the_child_imports_no_torch(process):
    process.noise_multiplier(**_call(2.0))
    assert process._run(_has_torch) is False


def test_a_child_killed_between_calls_is_replaced(process):
    first = process.pid()
    os.kill(first, signal.SIGKILL)
    sigma = process.noise_multiplier(**_call(1.9))  # in a new child, from empty caches
    assert process.pid() != first
    _clear()
    assert sigma == noise_multiplier(1.9, DELTA, Q, STEPS)


def _die_unless(parent: int) -> int:
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


def test_a_call_whose_children_die_is_computed_here(process, caplog):
    caplog.set_level(logging.ERROR, logger=ap.__name__)
    assert process._run(_die_unless, os.getpid()) == os.getpid()
    died = [r for r in caplog.records if "accountant process died" in r.getMessage()]
    assert len(died) == 2, [r.getMessage() for r in caplog.records]
    assert process.pid() != os.getpid()  # and the next call has a child again


def test_a_child_that_cannot_start_has_the_call_computed_here(monkeypatch, caplog):
    """A spawn that fails (EAGAIN: too many processes) is an error logged, not the caller's:
    the call is computed in this process, and the next call tries a child again."""
    import multiprocessing.context

    def refuse(process_obj):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    caplog.set_level(logging.ERROR, logger=ap.__name__)
    p = ap.AccountantProcess()
    try:
        monkeypatch.setattr(multiprocessing.context.SpawnProcess, "_Popen", staticmethod(refuse))
        _clear()
        sigma = p.noise_multiplier(**_call(1.8))
        failed = [r for r in caplog.records if "could not be started" in r.getMessage()]
        assert len(failed) == 1, [r.getMessage() for r in caplog.records]
        assert p._pool is None
        monkeypatch.undo()
        _clear()
        assert sigma == noise_multiplier(1.8, DELTA, Q, STEPS)
        assert p.pid() != os.getpid()
    finally:
        p.close()


def test_the_callers_settings_are_the_childs(process):
    coarser = dataclasses.replace(DEFAULT_SETTINGS, h_max=1e-2, rel_h=4.0)
    process.close()
    _clear()
    sigma = process.noise_multiplier(**_call(2.1), settings=coarser)
    _clear()
    assert sigma == noise_multiplier(2.1, DELTA, Q, STEPS, settings=coarser)
    assert sigma != noise_multiplier(2.1, DELTA, Q, STEPS)


def test_the_child_of_a_killed_parent_ends():
    """A parent killed with SIGKILL runs no exit handler: its child must notice by itself."""
    code = (
        "import os, signal, sys\n"
        "from dprc_core.accounting.accountant_process import AccountantProcess\n"
        "print(AccountantProcess().pid(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    parent = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    child = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 10 * ap.PARENT_POLL_SECONDS + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), f"the accountant process {child} outlived its killed parent"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended (its reaper is init)
