"""The vectorised self-composition (dprc_core.accounting.pld_self_compose) against
dp_accounting's own ``self_compose``: the same truncation range (or a wider one, never
narrower), the same probabilities and the same infinity mass, on random dense PMFs of several
shapes and on the real per-step PLDs the accountant builds (exact Gaussian, revealed- and
hidden-scale randomized clipping)."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import common, pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting import DEFAULT_SETTINGS, PrivacyEvent
from dprc_core.accounting.accountant import choose_grid, prepare
from dprc_core.accounting.pld_self_compose import self_compose, self_convolve_bounds


def _random_pmf(rng: np.random.Generator, n: int, zeros: float, inf: float) -> np.ndarray:
    p = rng.exponential(size=n) * (rng.random(n) >= zeros)
    p[0] = p[-1] = 1.0  # a support spanning the whole array
    return p / p.sum() * (1 - inf)


@pytest.mark.parametrize("n", [1, 2, 17, 300, 5000])
@pytest.mark.parametrize("times", [1, 2, 9, 400])
@pytest.mark.parametrize("truncation", [0.0, 1e-15, 1e-6])
def test_bounds_are_dp_accountings(n, times, truncation):
    rng = np.random.default_rng(n * 1000 + times)
    for zeros in (0.0, 0.9):
        probs = _random_pmf(rng, n, zeros, 0.0)
        ours = self_convolve_bounds(probs, times, truncation)
        theirs = common.compute_self_convolve_bounds(probs, times, truncation)
        assert ours[0] <= theirs[0] and ours[1] >= theirs[1]  # never narrower
        assert abs(ours[0] - theirs[0]) <= 1 and abs(ours[1] - theirs[1]) <= 1


def _assert_same_pmf(a: pld_pmf.PLDPmf, b: pld_pmf.PLDPmf) -> None:
    # pylint: disable=protected-access
    if isinstance(a, pld_pmf.SparsePLDPmf):
        assert isinstance(b, pld_pmf.SparsePLDPmf)
        assert a._loss_probs == b._loss_probs and a._infinity_mass == b._infinity_mass
        return
    assert isinstance(a, pld_pmf.DensePLDPmf) and isinstance(b, pld_pmf.DensePLDPmf)
    assert a._lower_loss == b._lower_loss
    assert a._discretization == b._discretization
    assert a._infinity_mass == b._infinity_mass
    np.testing.assert_allclose(a._probs, b._probs, rtol=0, atol=1e-15)


@pytest.mark.parametrize("times", [1, 3, 50])
def test_random_dense_plds_compose_as_dp_accountings(times):
    rng = np.random.default_rng(times)
    remove = pld_pmf.DensePLDPmf(1e-3, -40, _random_pmf(rng, 200, 0.3, 1e-9), 1e-9, True)
    add = pld_pmf.DensePLDPmf(1e-3, -55, _random_pmf(rng, 260, 0.0, 0.0), 0.0, True)
    for pld in (PrivacyLossDistribution(remove), PrivacyLossDistribution(remove, add)):
        ours = self_compose(pld, times, 1e-15)
        theirs = pld.self_compose(times, tail_mass_truncation=1e-15)
        _assert_same_pmf(ours._pmf_remove, theirs._pmf_remove)
        _assert_same_pmf(ours._pmf_add, theirs._pmf_add)
        for eps in (0.1, 1.0, 4.0):
            assert ours.get_delta_for_epsilon(eps) == pytest.approx(
                theirs.get_delta_for_epsilon(eps), rel=1e-9, abs=1e-18
            )


@pytest.mark.parametrize(
    "event",
    [
        PrivacyEvent(0.9, 0.05, 120, "exact", None),
        PrivacyEvent(1.1, 0.02, 300, "hutch", 32),
        PrivacyEvent(0.8, 0.05, 60, "hutch", 32, sketch="per_example"),
    ],
    ids=["exact", "hutch-shared", "hutch-per-example"],
)
def test_the_accountants_step_plds_compose_as_dp_accountings(event):
    tail = DEFAULT_SETTINGS.tail_fraction * 1e-5 / event.steps
    p = prepare(event, tail, DEFAULT_SETTINGS)
    h = choose_grid([p], DEFAULT_SETTINGS)
    step = p.pld(h, tail)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        theirs = step.self_compose(p.compositions, tail_mass_truncation=1e-15)
    ours = self_compose(step, p.compositions, 1e-15)
    _assert_same_pmf(ours._pmf_remove, theirs._pmf_remove)
    _assert_same_pmf(ours._pmf_add, theirs._pmf_add)
    assert ours.get_epsilon_for_delta(1e-5) == pytest.approx(
        theirs.get_epsilon_for_delta(1e-5), rel=1e-9
    )


def test_times_below_one_is_refused():
    pld = PrivacyLossDistribution(pld_pmf.DensePLDPmf(1e-3, 0, np.array([1.0]), 0.0, True))
    with pytest.raises(ValueError, match="times"):
        self_compose(pld, 0, 1e-15)
