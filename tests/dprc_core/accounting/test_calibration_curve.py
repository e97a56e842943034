"""Calibrations of one Poisson-subsampled Gaussian family share their compositions (the
family's ε(σ) curve): each answer still satisfies the calibration's contract, checked with
compositions made without the curve, and later targets cost few compositions."""

from __future__ import annotations

import math

import pytest

from dprc_core.accounting import SubsampledGaussianEvent, noise_multiplier
from dprc_core.accounting.accountant import account
from dprc_core.accounting.calibration import (
    EpsilonCurve,
    epsilon_curve,
    gaussian_epsilon,
)
from dprc_core.accounting.settings import AccountingSettings

DELTA = 1e-5
REL_TOL = 0.005


def _fresh_epsilon(sigma: float, q: float, steps: int, envelope: str, k: int | None) -> float:
    """ε composed now, without any curve (the reference the contract is stated against)."""
    sketch = "per_example" if envelope != "exact" else "shared"
    event = SubsampledGaussianEvent(sigma, q, steps, envelope, k, None, sketch)
    return account([event], DELTA).epsilon


@pytest.mark.parametrize(("envelope", "k"), [("exact", None), ("hutch", 32)])
def test_shared_curve_keeps_the_contract_and_saves_compositions(envelope, k):
    # a family no other test uses (its curve starts empty in this process)
    q, steps = 0.0371, 23
    sketch = "per_example" if envelope != "exact" else "shared"
    targets = [2.0 + 0.17 * i for i in range(8)]
    curve = None
    added = []
    for target in targets:
        before = len(curve) if curve is not None else 0
        sigma = noise_multiplier(target, DELTA, q, steps, envelope, k, sketch=sketch)
        if curve is None:
            family = (SubsampledGaussianEvent, q, steps, envelope, k, None, sketch)
            curve = epsilon_curve((family, DELTA, AccountingSettings()))
        added.append(len(curve) - before)
        assert _fresh_epsilon(sigma, q, steps, envelope, k) <= target
        assert _fresh_epsilon(sigma / (1 + REL_TOL), q, steps, envelope, k) > target
    assert added[0] >= 4  # the first one brackets from nothing
    # every later target starts from the curve's bracket: at most 3 fresh compositions
    assert max(added[1:]) <= 3, added
    assert sum(added[1:]) < 7 * added[0]


def test_planned_epsilon_is_the_calibration_composition():
    q, steps = 0.0412, 17
    sigma = noise_multiplier(3.0, DELTA, q, steps)
    event = SubsampledGaussianEvent(sigma, q, steps)
    assert gaussian_epsilon(event, DELTA) == pytest.approx(
        _fresh_epsilon(sigma, q, steps, "exact", None), rel=0, abs=0
    )


def test_curve_refuses_a_non_monotone_bracket():
    curve = EpsilonCurve()
    curve.add(1.0, 2.0)
    curve.add(1.1, 3.0)  # ε rising with σ: trust neither side
    assert curve.bracket(2.5) is None
    curve2 = EpsilonCurve()
    curve2.add(1.0, 3.0)
    curve2.add(1.2, 2.0)
    curve2.add(1.1, 2.6)
    assert curve2.bracket(2.5) == (1.1, 1.2)
    assert curve2.bracket(1.0) is None  # no composed σ reaches ε ≤ 1
    assert math.isclose(curve2.get(1.2) or 0.0, 2.0)
