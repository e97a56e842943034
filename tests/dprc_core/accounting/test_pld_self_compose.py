"""The vectorised self-composition and composition (dprc_core.accounting.pld_self_compose)
against dp_accounting's own ``self_compose`` and ``compose``: the same truncation range (or,
for self-composition, a wider one, never narrower), the same probabilities and the same
infinity mass, on random dense PMFs of several shapes and on the real per-step PLDs the
accountant builds (exact Gaussian, revealed- and hidden-scale randomized clipping)."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import common, pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting import DEFAULT_SETTINGS, PrivacyEvent
from dprc_core.accounting.accountant import choose_grid, prepare
from dprc_core.accounting.pld_self_compose import compose, self_compose, self_convolve_bounds


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


def _assert_identical(a: pld_pmf.PLDPmf, b: pld_pmf.PLDPmf) -> None:
    """Bit for bit: the composition adds the same float64s in the same order."""
    # pylint: disable=protected-access
    assert type(a) is type(b)
    if isinstance(a, pld_pmf.SparsePLDPmf):
        assert a._loss_probs == b._loss_probs and a._infinity_mass == b._infinity_mass
        return
    assert a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
    assert a._discretization == b._discretization
    assert np.array_equal(a._probs, b._probs)


@pytest.mark.parametrize(("n1", "n2"), [(1, 1), (7, 300), (2000, 3000), (40000, 600)])
@pytest.mark.parametrize("truncation", [0.0, 1e-15, 1e-6, 0.3])
def test_random_dense_plds_compose_as_dp_accountings_compose(n1, n2, truncation):
    rng = np.random.default_rng(n1 + n2)
    a = pld_pmf.DensePLDPmf(1e-3, -40, _random_pmf(rng, n1, 0.5, 1e-9), 1e-9, True)
    b = pld_pmf.DensePLDPmf(1e-3, 25, _random_pmf(rng, n2, 0.2, 0.0), 0.0, True)
    c = pld_pmf.DensePLDPmf(1e-3, -3, _random_pmf(rng, n2, 0.0, 1e-12), 1e-12, True)
    optimistic = pld_pmf.DensePLDPmf(1e-3, 0, _random_pmf(rng, n1, 0.1, 0.0), 0.0, False)
    optimistic2 = pld_pmf.DensePLDPmf(1e-3, 5, _random_pmf(rng, n2, 0.1, 0.0), 0.0, False)
    pairs = [
        (PrivacyLossDistribution(a), PrivacyLossDistribution(b)),
        (PrivacyLossDistribution(a, c), PrivacyLossDistribution(b)),
        (PrivacyLossDistribution(a, c), PrivacyLossDistribution(c, b)),
        (PrivacyLossDistribution(optimistic), PrivacyLossDistribution(optimistic2)),
    ]
    for first, second in pairs:
        ours = compose(first, second, truncation)
        theirs = first.compose(second, tail_mass_truncation=truncation)
        _assert_identical(ours._pmf_remove, theirs._pmf_remove)
        _assert_identical(ours._pmf_add, theirs._pmf_add)


def test_sparse_plds_compose_as_dp_accountings_compose():
    a = pld_pmf.SparsePLDPmf({-2: 0.25, 0: 0.5, 3: 0.25}, 1e-3, 0.0, True)
    b = pld_pmf.SparsePLDPmf({1: 0.9, 4: 0.1 - 1e-9}, 1e-3, 1e-9, True)
    first, second = PrivacyLossDistribution(a), PrivacyLossDistribution(b)
    for truncation in (0.0, 1e-15):
        ours = compose(first, second, truncation)
        theirs = first.compose(second, tail_mass_truncation=truncation)
        _assert_identical(ours._pmf_remove, theirs._pmf_remove)


def test_different_grids_are_refused_as_dp_accounting_refuses_them():
    a = PrivacyLossDistribution(pld_pmf.DensePLDPmf(1e-3, 0, np.ones(3) / 3, 0.0, True))
    b = PrivacyLossDistribution(pld_pmf.DensePLDPmf(2e-3, 0, np.ones(3) / 3, 0.0, True))
    with pytest.raises(ValueError, match="Discretization"):
        compose(a, b, 1e-15)


@pytest.mark.parametrize(
    "events",
    [
        [PrivacyEvent(0.9, 0.05, 120, "exact", None), PrivacyEvent(2.5, 0.01, 40, "exact", None)],
        [
            PrivacyEvent(1.1, 0.02, 30, "hutch", 32),
            PrivacyEvent(0.8, 0.05, 20, "hutch", 32, sketch="per_example"),
        ],
    ],
    ids=["exact", "hutch"],
)
def test_the_accountants_composed_plds_compose_as_dp_accountings(events):
    tails = [DEFAULT_SETTINGS.tail_fraction * 1e-5 / e.steps for e in events]
    prepared = [prepare(e, t, DEFAULT_SETTINGS) for e, t in zip(events, tails, strict=True)]
    h = choose_grid(prepared, DEFAULT_SETTINGS)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        plds = [
            self_compose(p.pld(h, t), p.compositions, 1e-15)
            for p, t in zip(prepared, tails, strict=True)
        ]
        ours = compose(plds[0], plds[1], 1e-15)
        theirs = plds[0].compose(plds[1], tail_mass_truncation=1e-15)
    _assert_identical(ours._pmf_remove, theirs._pmf_remove)
    _assert_identical(ours._pmf_add, theirs._pmf_add)


def _loop_prefix(arr, threshold):
    """dp_accounting's way: add one element at a time until the sum exceeds the threshold."""
    total = 0.0
    for i, x in enumerate(arr):
        total += float(x)
        if total > threshold:
            return i
    return len(arr)


@pytest.mark.parametrize("seed", range(4))
def test_the_truncated_prefix_is_the_loops_across_stretches(seed):
    from dprc_core.accounting.pld_self_compose import _FIRST_CHUNK, _prefix_to_truncate

    rng = np.random.default_rng(seed)
    arr = rng.random(9 * _FIRST_CHUNK) * 10.0 ** rng.uniform(-18, -6, 9 * _FIRST_CHUNK)
    sums = np.cumsum(arr)
    # thresholds reached in the first stretch, in later ones (1024, 2048, 4096 elements
    # long), at a stretch's last element, and never
    ends = [5, _FIRST_CHUNK - 1, _FIRST_CHUNK, 3 * _FIRST_CHUNK + 7, 7 * _FIRST_CHUNK - 1]
    thresholds = [0.0, *(float(sums[e]) for e in ends), float(sums[-1]), 1.0]
    for t in thresholds:
        assert _prefix_to_truncate(arr, t) == _loop_prefix(arr, t), t
    assert _prefix_to_truncate(arr[:0], 0.0) == 0
