"""ν-DP-FTRL events in the privacy ledger: PLD composition with DP-SGD events (checked against
dp_accounting with an independently computed sensitivity), JSON round trip, refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from scipy import special

from dprc_core import accounting
from dprc_core.accounting import PrivacyEvent, PrivacyLedger
from dprc_core.accounting.dpftrl import dpftrl_epsilon


def dense_sensitivity_first_columns(nu: float, steps: int, k: int, sep: int, bands=None) -> float:
    """Independent: dense B from the binomial formula, numpy inverse, columns 0, b, 2b, …
    (the maximiser for non-negative decreasing B⁻¹ coefficients, proven in docs and checked
    against full enumeration in test_dpftrl.py)."""
    tau = np.subtract.outer(np.arange(steps), np.arange(steps))
    lag = np.abs(tau)
    beta = np.where(tau >= 0, (-1.0) ** lag * special.binom(0.5, lag) * (1 - nu) ** lag, 0.0)
    if bands is not None:
        beta = np.where(tau < bands, beta, 0.0)
    inv = np.linalg.inv(beta)
    cols = [j * sep for j in range(k) if j * sep < steps]
    return float(np.linalg.norm(inv[:, cols].sum(axis=1)))


FTRL = dict(nu=0.05, participations=3, min_separation=100, bands=16)


def test_event_fields_and_sensitivity():
    e = PrivacyEvent.nu_dpftrl(1.5, 300, **FTRL)
    ref = dense_sensitivity_first_columns(0.05, 300, 3, 100, 16)
    assert e.sensitivity == pytest.approx(ref, rel=1e-8) and e.sensitivity >= ref
    assert e.mu == pytest.approx(e.sensitivity / 1.5)
    assert e.sample_rate == 1.0 and e.clipping == "exact"


def test_single_run_is_the_exact_gaussian_and_meets_a_calibrated_target():
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=1.5, steps=300, mechanism="nu-dp-ftrl", **FTRL)
    ours = ledger.epsilon(1e-5)
    sens = dense_sensitivity_first_columns(0.05, 300, 3, 100, 16)
    loss = GaussianPrivacyLoss(1.5, sensitivity=sens)
    assert loss.get_delta_for_epsilon(ours) == pytest.approx(1e-5, rel=1e-6)
    assert "exact" in ledger.account(1e-5).describe()
    # σ calibrated for a target: the ledger (as the service's budget check uses it) agrees
    sigma = accounting.dpftrl_noise_multiplier(2.0, 1e-5, steps=300, **FTRL)
    assert PrivacyLedger([PrivacyEvent.nu_dpftrl(sigma, 300, **FTRL)]).epsilon(1e-5) <= 2.0


def test_composition_with_dp_sgd_matches_dp_accounting():
    delta = 1e-6
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=1000)
    ledger.record(
        noise_multiplier=2.0,
        steps=400,
        mechanism="nu-dp-ftrl",
        nu=0.02,
        participations=4,
        min_separation=100,
    )
    sens = dense_sensitivity_first_columns(0.02, 400, 4, 100)
    ref_pld = (
        dpl.from_gaussian_mechanism(1.0, sampling_prob=0.01, value_discretization_interval=1e-4)
        .self_compose(1000)
        .compose(
            dpl.from_gaussian_mechanism(2.0, sensitivity=sens, value_discretization_interval=1e-4)
        )
    )
    ref = ref_pld.get_epsilon_for_delta(delta)
    ours = ledger.epsilon(delta)
    assert -0.005 <= ours / ref - 1 <= 0.01
    parts = [
        accounting.epsilon(1.0, 0.01, 1000, delta),
        dpftrl_epsilon(2.0, delta, 0.02, 400, 4, 100),
    ]
    assert max(parts) < ours < sum(parts)  # a PLD composition, not a sum of ε's


def test_two_runs_are_two_gaussians_not_one_longer_run():
    # two Gaussian mechanisms with μ compose to one with μ√2 (exact identity)
    e = PrivacyEvent.nu_dpftrl(1.2, 200, nu=0.1, participations=2, min_separation=100)
    ledger = PrivacyLedger([e, e])
    combined = GaussianPrivacyLoss(1.2, sensitivity=e.sensitivity * math.sqrt(2))
    assert combined.get_delta_for_epsilon(ledger.epsilon(1e-5)) == pytest.approx(1e-5, rel=1e-6)
    longer = PrivacyEvent.nu_dpftrl(1.2, 400, nu=0.1, participations=2, min_separation=100)
    assert ledger.epsilon(1e-5) > PrivacyLedger([longer]).epsilon(1e-5) * 1.2


def test_json_round_trip_and_v1_dp_sgd_ledgers_unchanged():
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=500, envelope="hutch", k=32)
    text_v1 = ledger.to_json()
    # a DP-SGD-only ledger is written exactly as before: no ν-DP-FTRL keys
    for event in json.loads(text_v1)["events"]:
        assert set(event) == {
            "noise_multiplier",
            "sample_rate",
            "steps",
            "clipping",
            "k",
            "rank",
            "mechanism",
        }
    ledger.record(PrivacyEvent.nu_dpftrl(1.5, 300, **FTRL))
    back = PrivacyLedger.from_json(ledger.to_json())
    assert back == ledger
    assert back.to_json() == ledger.to_json()
    # an old v1 ledger without any new field is read
    old = {
        "format": "dprc-privacy-ledger",
        "version": 1,
        "events": [{"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 10}],
    }
    assert PrivacyLedger.from_json(json.dumps(old)).events[0].mechanism == "gaussian"
    # ledgers written with the earlier names are read with the one name
    spelled = {**old, "events": [{**old["events"][0], "mechanism": "dp-sgd"}]}
    assert PrivacyLedger.from_json(json.dumps(spelled)).events[0].mechanism == "gaussian"


def test_stored_sensitivity_can_only_raise_the_recomputed_one():
    payload = json.loads(PrivacyLedger([PrivacyEvent.nu_dpftrl(1.5, 300, **FTRL)]).to_json())
    true = payload["events"][0]["sensitivity"]
    payload["events"][0]["sensitivity"] = true * 0.9  # never lowers the recomputed value
    assert PrivacyLedger.from_json(json.dumps(payload)).events[0].sensitivity == true
    payload["events"][0]["sensitivity"] = true * 1.5  # larger: conservative, kept
    assert PrivacyLedger.from_json(json.dumps(payload)).events[0].sensitivity == true * 1.5
    payload["events"][0]["sensitivity"] = -1.0
    with pytest.raises(ValueError, match="sensitivity must be"):
        PrivacyLedger.from_json(json.dumps(payload))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(envelope="hutch", k=32), "randomized clipping"),
        (dict(envelope="hutchpp", k=8), "randomized clipping"),
        (dict(sample_rate=0.01), "sample_rate must be 1"),
        (dict(nu=None), "needs"),
        (dict(participations=None), "needs"),
        (dict(nu=1.5), "nu"),
        (dict(bands=0), "bands"),
    ],
)
def test_invalid_nu_dpftrl_events_are_refused(kwargs, match):
    args = (
        dict(
            noise_multiplier=1.0,
            steps=100,
            mechanism="nu-dp-ftrl",
            nu=0.1,
            participations=2,
            min_separation=50,
        )
        | kwargs
    )
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match=match):
        ledger.record(**args)
    assert len(ledger) == 0


def test_dpftrl_fields_on_dp_sgd_events_are_refused():
    with pytest.raises(ValueError, match="only meaningful"):
        PrivacyEvent(1.0, 0.01, 10, nu=0.1)
