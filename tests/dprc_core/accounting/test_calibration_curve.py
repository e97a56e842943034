"""Calibrations of one Poisson-subsampled Gaussian family share their compositions (the
family's ε(σ) curve): each answer still satisfies the calibration's contract, checked with
compositions made without the curve, and later targets cost few compositions."""

from __future__ import annotations

import math
import random

import pytest

from dprc_core.accounting import SubsampledGaussianEvent, calibration, noise_multiplier
from dprc_core.accounting.accountant import account
from dprc_core.accounting.calibration import (
    EpsilonCurve,
    _gaussian_family,
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
            # the family of the events calibrated (their hidden-scale law included)
            family = _gaussian_family(
                SubsampledGaussianEvent(1.0, q, steps, envelope, k, None, sketch)
            )
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


def _burst(order_seed: int, closing: bool, monkeypatch) -> tuple[int, list[tuple[float, float]]]:
    """Thirty calibrations of one family against a known ε(σ) (decreasing, close to σ^-4, as
    a 20-step hidden-scale family's between ε = 2 and 3.5: neighbouring targets' σ about
    rel_tol apart), in a shuffled order: the fresh compositions after the first, and each
    (target, σ)."""
    if not closing:
        monkeypatch.setattr(calibration, "_closing_proposal", lambda *args: None)
    curve = EpsilonCurve()
    calls = 0

    def eps_of(sigma: float) -> float:
        nonlocal calls
        calls += 1
        return _known_epsilon(sigma)

    targets = [2.0 + 0.05 * i for i in range(30)]
    random.Random(order_seed).shuffle(targets)
    answers = []
    first = 0
    for i, target in enumerate(targets):
        answers.append((target, calibration._calibrate(eps_of, target, REL_TOL, 1e3, curve)))
        if i == 0:
            first = calls
    monkeypatch.undo()
    return calls - first, answers


def _known_epsilon(sigma: float) -> float:
    return 3.0 * sigma**-4.0 * (1.0 + 0.02 * sigma)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closing_proposals_keep_the_contract_and_save_compositions(seed, monkeypatch):
    """Where the curve already holds a σ within rel_tol of the root, the calibration composes
    the σ that closes its bracket at once: every answer still meets the contract (checked on
    the known ε(σ)), with fewer compositions than the secant steps alone."""
    closing, answers = _burst(seed, True, monkeypatch)
    secant, former = _burst(seed, False, monkeypatch)
    for target, sigma in answers + former:
        assert _known_epsilon(sigma) <= target < _known_epsilon(sigma / (1 + REL_TOL))
    assert closing < secant
    assert closing <= 1.5 * 29  # most later targets close in one composition
