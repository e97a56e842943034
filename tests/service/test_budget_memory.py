"""A create's calibration and its budget check give back the memory of big compositions
(issue 45: the API's RSS after 10⁷-scale creates): the service asks the accountant to release
after each (``dprc_core.accounting.memory.release_if_big``: nothing unless a big transform
ran)."""

from __future__ import annotations

import os

import pytest

from dprc_core.accounting import SubsampledGaussianEvent
from dprc_core.accounting import memory as acc_memory
from dprc_core.noise import Gaussian
from service.budget import budget, planning


def test_calibration_and_budget_check_release(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(planning, "release_if_big", lambda: calls.append("plan"))
    monkeypatch.setattr(budget, "release_if_big", lambda: calls.append("budget"))
    planning.library_plan(1234, 17, 1, "exact", None, 2.5, None, Gaussian())
    assert calls == ["plan"]
    ev = SubsampledGaussianEvent(1.0, 0.01, 100)
    budget.compose([ev, ev], 1e-5)
    assert calls == ["plan", "budget"]


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc only")
def test_big_create_gives_its_memory_back() -> None:
    """A 10⁶-example create (977 steps) then a 3·10⁶ one: the process's RSS back within a few
    MiB (benchmarks/create_memory.py measures the 10⁷ case: +119 MiB before, −3 MiB after)."""
    planning.library_plan(400, 20, 1, "exact", None, 2.0, None, Gaussian())
    acc_memory.release_memory()
    start = _rss_mib()
    for n in (1_000_000, 3_000_000):
        plan = planning.library_plan(n, 1024, 1, "exact", None, 2.0, None, Gaussian())
        ev = SubsampledGaussianEvent(plan.noise_multiplier, plan.sample_rate, plan.steps)
        budget.compose([ev], plan.delta)
    assert _rss_mib() - start < 16
