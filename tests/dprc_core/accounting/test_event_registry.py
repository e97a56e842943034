"""The registry of event classes (filled by the PLD builders' registration), the deprecated
flat form answered by one shim, and dispatch without branches on a mechanism's name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dprc_core.accounting import (
    NuDPFTRLEvent,
    PrivacyEvent,
    PrivacyLedger,
    SubsampledGaussianEvent,
    events,
    pld_builders,
)
from dprc_core.accounting.events_compat import flat_event
from dprc_core.accounting.steps import fixed_order_steps, planned_steps, poisson_steps

# one event (or more) of every registered class; a class registered without one here fails
EXAMPLES: dict[type[PrivacyEvent], list[PrivacyEvent]] = {
    SubsampledGaussianEvent: [
        SubsampledGaussianEvent(1.1, 0.01, 500),
        SubsampledGaussianEvent(1.0, 0.02, 300, "hutch", 16, 3),
        SubsampledGaussianEvent(0.9, 0.5, 7, "hutchpp", 8, sketch="per_example"),
    ],
    NuDPFTRLEvent: [
        NuDPFTRLEvent(2.0, 40, 1.0, 4, 10),
        NuDPFTRLEvent(1.5, 300, 0.1, 2, 150, bands=3),
        NuDPFTRLEvent.prefix(1.2, 25, 0.3, 10),
    ],
}


def test_every_registered_class_round_trips_through_its_json():
    registered = pld_builders.registered_event_types()
    assert set(registered) == set(EXAMPLES)
    for event_type in registered:
        assert pld_builders.event_type_named(event_type.mechanism) is event_type
        for event in EXAMPLES[event_type]:
            data = json.loads(json.dumps(event.to_dict()))
            assert data["mechanism"] == event_type.mechanism
            for reader in (PrivacyEvent, event_type):
                back = reader.from_dict(data)
                assert type(back) is event_type and back == event
                assert back.to_dict() == event.to_dict()


def test_earlier_spellings_name_the_registered_classes():
    assert pld_builders.event_type_named("dp-sgd") is SubsampledGaussianEvent
    assert pld_builders.event_type_named("nu-dp-ftrl") is NuDPFTRLEvent
    assert pld_builders.event_type_named("nu-dpftrl") is NuDPFTRLEvent


@pytest.mark.parametrize("name", ["ghost", "laplace", "", None, 3])
def test_an_unknown_mechanism_is_a_clear_value_error(name):
    data = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 3, "mechanism": name}
    with pytest.raises(ValueError, match=r"unknown mechanism .*expected one of \('gaussian'"):
        PrivacyEvent.from_dict(data)
    with pytest.raises(ValueError, match="unknown mechanism"):
        pld_builders.event_type_named(name)
    ledger = {"format": "dprc-privacy-ledger", "version": 1, "events": [data]}
    with pytest.raises(ValueError, match="privacy ledger event 0: unknown mechanism"):
        PrivacyLedger.from_json(json.dumps(ledger))


def test_a_mechanism_name_is_registered_once(monkeypatch):
    monkeypatch.setattr(pld_builders, "_BUILDERS", dict(pld_builders._BUILDERS))
    monkeypatch.setattr(events, "_EVENT_TYPES", dict(events._EVENT_TYPES))  # the names too

    class _Twin(SubsampledGaussianEvent):
        pass

    with pytest.raises(ValueError, match="'gaussian' is already the name of Subsampled"):
        pld_builders.pld_builder(_Twin)(pld_builders.PLDBuilder)


FLAT_CASES = [
    ((1.0, 0.01, 10), {}, SubsampledGaussianEvent(1.0, 0.01, 10)),
    ((1.0, 0.01, 10, "hutch", 16, 3), {}, SubsampledGaussianEvent(1.0, 0.01, 10, "hutch", 16, 3)),
    (
        (1.0, 0.01, 10, "hutchpp", 8),
        {"sketch": "per_example"},
        SubsampledGaussianEvent(1.0, 0.01, 10, "hutchpp", 8, sketch="per_example"),
    ),
    (
        (2.0, 1.0, 40),
        {"mechanism": "nu_dpftrl", "nu": 1.0, "participations": 4, "min_separation": 10},
        NuDPFTRLEvent(2.0, 40, 1.0, 4, 10),
    ),
    (
        (1.5, 1.0, 300),
        {"mechanism": "nu-dp-ftrl", "nu": 0.1, "participations": 2, "min_separation": 150,
         "bands": 3},
        NuDPFTRLEvent(1.5, 300, 0.1, 2, 150, bands=3),
    ),
]  # fmt: skip


@pytest.mark.parametrize("args,kwargs,expected", FLAT_CASES)
def test_the_deprecated_flat_form_warns_and_builds_the_concrete_event(args, kwargs, expected):
    for build in (PrivacyEvent, flat_event):
        with pytest.warns(DeprecationWarning, match="deprecated") as caught:
            event = build(*args, **kwargs)
        assert {w.filename for w in caught} == {__file__}  # the caller's line
        assert type(event) is type(expected) and event == expected
        assert event.to_dict() == expected.to_dict()
    names = ("noise_multiplier", "sample_rate", "steps", "envelope", "k", "rank")
    fields = dict(zip(names, args, strict=False)) | kwargs
    with pytest.warns(DeprecationWarning, match=r"PrivacyLedger.record\(\)"):
        assert PrivacyLedger().record(**fields) == expected
    assert PrivacyLedger().record(expected) == expected  # the event itself: silent


def test_the_deprecated_nu_dpftrl_helpers_warn_and_build_the_concrete_event():
    with pytest.warns(DeprecationWarning, match=r"use NuDPFTRLEvent\.prefix"):
        assert PrivacyEvent.nu_dpftrl_prefix(2.0, 40, 1.0, 10) == NuDPFTRLEvent.prefix(
            2.0, 40, 1.0, 10
        )
    with pytest.warns(DeprecationWarning, match=r"use NuDPFTRLEvent\(\.\.\.\)"):
        assert PrivacyEvent.nu_dpftrl(2.0, 40, 1.0, 4, 10) == NuDPFTRLEvent(2.0, 40, 1.0, 4, 10)


def test_the_step_rules_and_the_deprecated_mechanism_argument():
    for n, b, e in [(30, 1, 0.1), (1000, 8, 1.5), (101, 10, 3)]:
        assert planned_steps(n, b, e) == poisson_steps(n, b, e)
        assert planned_steps(n, b, e, fixed_order=True) == fixed_order_steps(n, b, e)
        with pytest.warns(DeprecationWarning, match="fixed_order"):
            assert planned_steps(n, b, e, "gaussian") == poisson_steps(n, b, e)
        with pytest.warns(DeprecationWarning, match="fixed_order"):
            assert planned_steps(n, b, e, "nu_dpftrl") == fixed_order_steps(n, b, e)
    assert poisson_steps(30, 1, 0.1) == 3 and fixed_order_steps(101, 10, 3) == 33
    assert SubsampledGaussianEvent.fixed_order is False and NuDPFTRLEvent.fixed_order is True


def test_the_accounting_package_does_not_branch_on_a_mechanism_name():
    package = Path(__file__).resolve().parents[3] / "dprc_core" / "accounting"
    branch = re.compile(r"mechanism\s*[!=]=|[!=]=\s*(NU_DPFTRL|GAUSSIAN|DP_SGD)\b")
    found = [
        f"{path.name}:{i}: {line.strip()}"
        for path in sorted(package.glob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if branch.search(line)
    ]
    assert found == []
