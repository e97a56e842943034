"""Privacy ledger: events, heterogeneous composition, JSON round trip and validation."""

from __future__ import annotations

import json

import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl

from dprc_core import accounting
from dprc_core.accounting import PrivacyEvent, PrivacyLedger, UnsupportedMechanismError


def test_record_by_fields_and_by_event():
    ledger = PrivacyLedger()
    e1 = ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=500)
    e2 = ledger.record(PrivacyEvent(1.2, 0.01, 300, "hutch", k=32))
    assert ledger.events == (e1, e2)
    assert e1.clipping == "exact" and e1.mechanism == "gaussian"
    with pytest.raises(ValueError):
        ledger.record(e1, steps=3)
    with pytest.raises(ValueError):
        ledger.record(noise_multiplier=1.0, sample_rate=0.01)


def test_empty_ledger_has_zero_epsilon():
    assert PrivacyLedger().epsilon(1e-5) == 0.0


def test_single_event_equals_epsilon_and_split_events_compose_exactly():
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=400)
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=600)
    assert ledger.epsilon(1e-5) == accounting.epsilon(1.0, 0.01, 1000, 1e-5)


def test_heterogeneous_events_compose_as_one_pld():
    """A resumed job with a new σ: one composed PLD (checked against dp_accounting composing
    the two Gaussian PLDs), strictly below the sum of the ε's."""
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=0.8, sample_rate=0.02, steps=300)
    ledger.record(noise_multiplier=1.5, sample_rate=0.02, steps=2000)
    delta = 1e-6
    ref_pld = (
        dpl.from_gaussian_mechanism(0.8, sampling_prob=0.02)
        .self_compose(300)
        .compose(dpl.from_gaussian_mechanism(1.5, sampling_prob=0.02).self_compose(2000))
    )
    ref = ref_pld.get_epsilon_for_delta(delta)
    ours = ledger.epsilon(delta)
    assert -0.005 <= ours / ref - 1 <= 0.01
    parts = [accounting.epsilon(0.8, 0.02, 300, delta), accounting.epsilon(1.5, 0.02, 2000, delta)]
    assert max(parts) < ours < sum(parts)


def test_mixed_clipping_jobs_on_one_dataset():
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=500, envelope="hutch", k=32)
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=500)
    both = ledger.epsilon(1e-5)
    hutch_only = accounting.epsilon(1.0, 0.01, 1000, 1e-5, "hutch", 32)
    exact_only = accounting.epsilon(1.0, 0.01, 1000, 1e-5)
    assert exact_only < both < hutch_only


def test_json_round_trip_recomputes_epsilon():
    ledger = PrivacyLedger()
    ledger.record(
        noise_multiplier=1.1, sample_rate=0.005, steps=1234, envelope="hutch", k=16, rank=3
    )
    ledger.record(noise_multiplier=0.9, sample_rate=0.01, steps=10)
    text = ledger.to_json()
    payload = json.loads(text)
    assert "epsilon" not in text  # ε is never stored, always recomputed
    assert payload["format"] == "dprc-privacy-ledger" and len(payload["events"]) == 2
    again = PrivacyLedger.from_json(text)
    assert again == ledger
    assert again.epsilon(1e-5) == ledger.epsilon(1e-5)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda p: p.update(format="other"), "not a privacy ledger"),
        (lambda p: p.update(version=99), "version"),
        (lambda p: p.update(extra=1), "unknown privacy ledger fields"),
        (lambda p: p.update(events={}), "must be a list"),
        (lambda p: p["events"][0].update(noise_multiplier=-1.0), "event 0: noise_multiplier"),
        (lambda p: p["events"][0].update(steps=2.5), "steps"),
        (lambda p: p["events"][0].update(sample_rate=1.5), "sample_rate"),
        (lambda p: p["events"][0].update(clipping="fgc"), "clipping"),
        (lambda p: p["events"][0].update(clipping="hutch"), "needs the projection dimension"),
        (lambda p: p["events"][0].update(k=8), "only meaningful"),
        (lambda p: p["events"][0].update(color="red"), "unknown event fields"),
        (lambda p: p["events"][0].pop("steps"), "missing"),
        (lambda p: p["events"][0].update(mechanism="laplace"), "unknown mechanism"),
    ],
)
def test_from_json_validates(mutate, match):
    ledger = PrivacyLedger()
    ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=10)
    payload = json.loads(ledger.to_json())
    mutate(payload)
    with pytest.raises(ValueError, match=match):
        PrivacyLedger.from_json(json.dumps(payload))


def test_from_json_rejects_garbage():
    for text in ("not json", "[1, 2]", "null"):
        with pytest.raises(ValueError):
            PrivacyLedger.from_json(text)


def test_nu_dpftrl_without_its_fields_is_refused_not_misaccounted():
    """ν-DP-FTRL is accounted now (tests/dprc_core/accounting/test_ledger_dpftrl.py); an event that
    lacks its participation pattern, or that claims Poisson sampling, is still refused rather
    than accounted as DP-SGD."""
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="nu_dpftrl"):  # the old spelling, read as nu_dpftrl
        ledger.record(noise_multiplier=1.0, sample_rate=0.01, steps=10, mechanism="nu-dp-ftrl")
    assert len(ledger) == 0
    payload = {
        "format": "dprc-privacy-ledger",
        "version": 1,
        "events": [
            {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 10, "mechanism": "nu-dp-ftrl"}
        ],
    }
    with pytest.raises(ValueError):
        PrivacyLedger.from_json(json.dumps(payload))
    assert issubclass(UnsupportedMechanismError, NotImplementedError)  # still exported
