"""The default discretisation is within 1% of a 10× finer one (loss grid and scale bins), and
both are upper bounds: the finer one is never above the default by more than noise."""

from __future__ import annotations

import pytest

from dprc_core.accounting import DEFAULT_SETTINGS, PrivacyEvent, epsilon_for_events

CASES = [
    PrivacyEvent(1.0, 1e-3, 10_000, "exact"),
    PrivacyEvent(1.0, 1e-3, 10_000, "hutch", 32),
    PrivacyEvent(3.0, 32 / 1800, 171, "hutch", 8),
    PrivacyEvent(1.0, 32 / 1800, 171, "hutchpp", 64),
    PrivacyEvent(0.9, 0.01, 1_000, "hutch", 16, 4),
    PrivacyEvent(2.0, 0.2, 50, "hutch", 64),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "event", CASES, ids=[f"{e.clipping}-k{e.k}-r{e.rank}-q{e.sample_rate:.3g}" for e in CASES]
)
def test_default_within_one_percent_of_ten_times_finer(event):
    delta = 1e-6
    default = epsilon_for_events([event], delta)
    fine = epsilon_for_events([event], delta, DEFAULT_SETTINGS.finer(10))
    assert fine <= default * (1 + 1e-6)
    assert default <= fine * 1.01, f"default {default} vs 10x finer {fine}"
