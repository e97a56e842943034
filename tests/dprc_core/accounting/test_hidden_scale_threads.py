"""The hidden-scale mixtures evaluated on several threads (issue 45, busy creates) are the
values of one thread to the bit: each block of points is computed alone by the same operations,
so δ's, PMFs and ε's are unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from dprc_core.accounting import SubsampledGaussianEvent, epsilon_for_events
from dprc_core.accounting import hidden_scale_pld as hsp
from dprc_core.accounting import history as hist
from dprc_core.accounting.accountant import DEFAULT_SETTINGS
from dprc_core.accounting.subsampled_gaussian_builder import _one_step

EVENT = SubsampledGaussianEvent(0.9, 0.05, 20, "hutch", 32, sketch="per_example")


@pytest.fixture
def threads(monkeypatch):
    """Sets the thread count; every law goes to the pool (the laws here have ~90 atoms, below
    the pool's threshold)."""
    monkeypatch.setattr(hsp, "_THREAD_MIN_ATOMS", 0)
    before = hsp._THREADS
    yield hsp.set_threads
    hsp.set_threads(before)


def test_small_laws_stay_in_the_calling_thread() -> None:
    """A law below _THREAD_MIN_ATOMS is evaluated without the pool (handing its blocks over
    costs what they take), one at or above it on the pool."""
    before = hsp._THREADS
    try:
        hsp.set_threads(2)
        mech, _ = _one_step(
            EVENT.__class__(0.9, 0.05, 1, "hutch", 32, None, "per_example"), 1e-9, DEFAULT_SETTINGS
        )
        law = hsp._Law.of(mech)
        assert law.s.size < hsp._THREAD_MIN_ATOMS
        hsp.hidden_delta(np.linspace(-3.0, 6.0, 2500), mech, "remove")
        assert hsp._POOL is None
        big = hsp._Law(
            np.linspace(0.5, 3.0, hsp._THREAD_MIN_ATOMS),
            np.full(hsp._THREAD_MIN_ATOMS, -np.log(hsp._THREAD_MIN_ATOMS)),
            0.0,
        )
        hsp._phi_bar_mix(np.linspace(-3.0, 5.0, 2 * hsp._CHUNK), big)
        assert hsp._POOL is not None
    finally:
        hsp.set_threads(before)


def _pmf_arrays(pld) -> list[np.ndarray]:
    out = []
    for pmf in (pld._pmf_remove, pld._pmf_add):
        dense = pmf.to_dense_pmf()
        out.append(np.asarray(dense._probs))
        out.append(np.array([dense._lower_loss, dense._infinity_mass]))
    return out


def test_mixtures_and_thresholds_bit_for_bit(threads) -> None:
    mech, _ = _one_step(
        EVENT.__class__(0.9, 0.05, 1, "hutch", 32, None, "per_example"), 1e-9, DEFAULT_SETTINGS
    )
    law = hsp._Law.of(mech)
    t = np.linspace(-12.0, 12.0, 3001)  # 6 blocks, the last one short
    eps = np.linspace(-3.0, 6.0, 2500)
    threads(1)
    one = [hsp._phi_bar_mix(t, law), hsp._phi_mix(t, law), *hsp._h_and_slope(t, law)]
    one += [hsp.hidden_delta(eps, mech, d) for d in ("remove", "add")]
    threads(3)
    many = [hsp._phi_bar_mix(t, law), hsp._phi_mix(t, law), *hsp._h_and_slope(t, law)]
    many += [hsp.hidden_delta(eps, mech, d) for d in ("remove", "add")]
    for a, b in zip(one, many, strict=True):
        assert a.tobytes() == b.tobytes()


def test_step_pld_and_epsilon_bit_for_bit(threads) -> None:
    mech, geometry = _one_step(
        EVENT.__class__(0.9, 0.05, 1, "hutch", 32, None, "per_example"), 1e-9, DEFAULT_SETTINGS
    )
    threads(1)
    one = _pmf_arrays(hsp.hidden_step_pld(mech, 2.0**-10, 1e-9, geometry))
    hist.clear_cache()
    eps_one = epsilon_for_events([EVENT], 1e-5)
    threads(2)
    many = _pmf_arrays(hsp.hidden_step_pld(mech, 2.0**-10, 1e-9, geometry))
    hist.clear_cache()
    eps_many = epsilon_for_events([EVENT], 1e-5)
    for a, b in zip(one, many, strict=True):
        assert a.tobytes() == b.tobytes()
    assert eps_one == eps_many


def test_empty_input() -> None:
    mech, _ = _one_step(
        EVENT.__class__(0.9, 0.05, 1, "hutch", 32, None, "per_example"), 1e-9, DEFAULT_SETTINGS
    )
    law = hsp._Law.of(mech)
    assert hsp._phi_bar_mix(np.empty(0), law).shape == (0,)
    assert hsp._phi_mix(np.empty(0), law).shape == (0,)


def test_in_place_mixtures_are_the_former_expressions() -> None:
    """Each block's Φ̄ / Φ computed in place: the values of the former
    ``einsum(w, ndtr(s − t))`` / ``einsum(w, ndtr(t − s))`` per 512-point block, to the bit."""
    mech, _ = _one_step(
        EVENT.__class__(0.9, 0.05, 1, "hutch", 32, None, "per_example"), 1e-9, DEFAULT_SETTINGS
    )
    law = hsp._Law.of(mech)
    w = np.exp(law.log_w)
    t = np.linspace(-40.0, 40.0, 1777)
    bar = np.concatenate(
        [
            np.einsum("j,jk->k", w, special.ndtr(law.s[:, None] - t[None, i : i + 512]))
            for i in range(0, t.size, 512)
        ]
    )
    cdf = np.concatenate(
        [
            np.einsum("j,jk->k", w, special.ndtr(t[None, i : i + 512] - law.s[:, None]))
            for i in range(0, t.size, 512)
        ]
    )
    assert hsp._phi_bar_mix(t, law).tobytes() == bar.tobytes()
    assert hsp._phi_mix(t, law).tobytes() == cdf.tobytes()
