"""One event class per mechanism: dispatch from the flat form, the JSON format, the PLD
builder registry, the calibration of any event family and the `envelope` vocabulary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from dprc_core import accounting
from dprc_core.accounting import (
    NuDPFTRLEvent,
    PrivacyEvent,
    PrivacyLedger,
    SubsampledGaussianEvent,
    UnsupportedMechanismError,
    calibrate,
    epsilon,
    epsilon_for_events,
    events,
    noise_multiplier,
    pld_builders,
)
from dprc_core.accounting.accountant import SUPPORTED_EVENTS, account
from dprc_core.accounting.describe import envelope_words, sketch_words
from dprc_core.accounting.dpftrl import dpftrl_epsilon
from dprc_core.accounting.events import check_clipping, check_envelope, check_sketch
from dprc_core.accounting.history import epsilon_for_history
from dprc_core.cli import main

DELTA = 1e-5
SENS = 2.0 * (1 + 1e-9)  # nu = 1, 4 participations: sqrt(4), rounded up (ROUNDOFF_MARGIN)


# ------------------------------------------------------------------ dispatch of the flat form
def test_the_flat_form_builds_the_subclass_its_fields_name():
    # the flat form is deprecated: every call warns once, at the caller's line
    with pytest.warns(DeprecationWarning, match="deprecated") as caught:
        exact = PrivacyEvent(1.0, 0.01, 10)
        hutch = PrivacyEvent(1.0, 0.01, 10, "hutch", 16, 3)
        per_example = PrivacyEvent(1.0, 0.01, 10, "hutchpp", 8, sketch="per_example")
        run = PrivacyEvent(
            2.0, 1.0, 40, mechanism="nu_dpftrl", nu=1.0, participations=4, min_separation=10
        )
        legacy = PrivacyEvent(2.0, 1.0, 40, mechanism="nu-dp-ftrl", nu=1.0, participations=4,
                              min_separation=10)  # fmt: skip
        by_method = PrivacyEvent.nu_dpftrl(2.0, 40, 1.0, 4, 10)
        prefix = PrivacyEvent.nu_dpftrl_prefix(2.0, 40, 1.0, 10)
    assert len(caught) == 7 and {w.filename for w in caught} == {__file__}
    assert type(exact) is type(hutch) is type(per_example) is SubsampledGaussianEvent
    assert type(run) is type(legacy) is type(by_method) is type(prefix) is NuDPFTRLEvent
    for e in (exact, hutch, per_example, run, prefix):
        assert isinstance(e, PrivacyEvent)
    assert exact == SubsampledGaussianEvent(1.0, 0.01, 10)
    assert hutch == SubsampledGaussianEvent(1.0, 0.01, 10, envelope="hutch", k=16, rank=3)
    assert per_example == SubsampledGaussianEvent(1.0, 0.01, 10, "hutchpp", 8, sketch="per_example")
    assert run == legacy == by_method == prefix == NuDPFTRLEvent(2.0, 40, 1.0, 4, 10)
    assert prefix == NuDPFTRLEvent.prefix(2.0, 40, 1.0, 10)  # ⌈40 / 10⌉ = 4 participations
    # the fields every event reads, constant where the mechanism does not vary them
    assert (hutch.mechanism, hutch.clipping, hutch.envelope, hutch.sketch) == (
        "gaussian",
        "hutch",
        "hutch",
        "shared",
    )
    assert (run.mechanism, run.clipping, run.envelope, run.sample_rate) == (
        "nu_dpftrl",
        "exact",
        "exact",
        1.0,
    )
    assert (run.k, run.rank, run.sketch) == (None, None, "shared")
    # with nu = 1 the noise is independent (B = I): the sensitivity is sqrt(participations),
    # rounded up by the relative round-off margin 1e-9
    assert run.sensitivity == SENS and run.mu == SENS / 2.0
    with pytest.raises(ValueError, match="nu_dpftrl events only"):
        _ = exact.mu


def test_the_flat_form_keeps_its_validation_and_messages():
    cases = [
        (dict(mechanism="laplace"), "unknown mechanism"),
        (dict(nu=0.1), "only meaningful for mechanism 'nu_dpftrl'"),
        (dict(envelope="ghost"), "clipping must be one of"),
        (dict(envelope="hutch"), "needs the projection dimension k"),
        (dict(sketch="per_example"), "exact norms draw no sketch"),
        (dict(mechanism="nu_dpftrl", nu=0.1, participations=1, min_separation=1), "sample_rate"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            PrivacyEvent(1.0, 0.5, 10, **kwargs)
    ftrl = dict(mechanism="nu_dpftrl", nu=0.1, participations=1, min_separation=1)
    with pytest.raises(ValueError, match="randomized clipping"):
        PrivacyEvent(1.0, 1.0, 10, "hutch", 8, **ftrl)
    with pytest.raises(ValueError, match=r"needs \['nu'\]"):
        PrivacyEvent(1.0, 1.0, 10, mechanism="nu_dpftrl", participations=1, min_separation=1)
    with pytest.raises(ValueError, match="steps"):
        NuDPFTRLEvent(1.0, 0, 0.1, 1, 1)


def test_a_stored_sensitivity_is_kept_only_when_larger():
    assert NuDPFTRLEvent(2.0, 40, 1.0, 4, 10, sensitivity=3.5).sensitivity == 3.5
    assert NuDPFTRLEvent(2.0, 40, 1.0, 4, 10, sensitivity=0.5).sensitivity == SENS
    with pytest.raises(ValueError, match="sensitivity"):
        NuDPFTRLEvent(2.0, 40, 1.0, 4, 10, sensitivity=-1.0)


# ------------------------------------------------------------------ the JSON format
# The documented format (docs/accounting.md §6): noise_multiplier, sample_rate, steps,
# clipping, k, rank, mechanism; "sketch" and its hidden-scale law "scale_width" only when
# per_example (the law of an event built now: 0.01); a nu_dpftrl event adds nu,
# bands, participations, min_separation, sensitivity (and never writes a sketch).
EXPECTED = [
    (
        SubsampledGaussianEvent(1.1, 0.01, 500),
        {
            "noise_multiplier": 1.1,
            "sample_rate": 0.01,
            "steps": 500,
            "clipping": "exact",
            "k": None,
            "rank": None,
            "mechanism": "gaussian",
        },
    ),
    (
        SubsampledGaussianEvent(1.0, 0.02, 300, "hutch", 16, 3),
        {
            "noise_multiplier": 1.0,
            "sample_rate": 0.02,
            "steps": 300,
            "clipping": "hutch",
            "k": 16,
            "rank": 3,
            "mechanism": "gaussian",
        },
    ),
    (
        SubsampledGaussianEvent(1.0, 0.02, 300, "hutchpp", 8, sketch="per_example"),
        {
            "noise_multiplier": 1.0,
            "sample_rate": 0.02,
            "steps": 300,
            "clipping": "hutchpp",
            "k": 8,
            "rank": None,
            "mechanism": "gaussian",
            "sketch": "per_example",
            "scale_width": 0.01,
        },
    ),
    (
        NuDPFTRLEvent(2, 40, 1, 4, 10, bands=3),
        {
            "noise_multiplier": 2.0,
            "sample_rate": 1.0,
            "steps": 40,
            "clipping": "exact",
            "k": None,
            "rank": None,
            "mechanism": "nu_dpftrl",
            "nu": 1.0,
            "bands": 3,
            "participations": 4,
            "min_separation": 10,
            "sensitivity": SENS,
        },
    ),
]


@pytest.mark.parametrize("event,expected", EXPECTED)
def test_json_is_the_documented_format_and_round_trips(event, expected):
    written = event.to_dict()
    assert list(written.items()) == list(expected.items())  # the same keys in the same order
    assert json.dumps(written) == json.dumps(expected)
    assert PrivacyEvent.from_dict(expected) == event
    assert type(event).from_dict(expected) == event
    other = SubsampledGaussianEvent if isinstance(event, NuDPFTRLEvent) else NuDPFTRLEvent
    with pytest.raises(ValueError, match=f"expected a {other.__name__}"):
        other.from_dict(expected)


def test_earlier_json_stays_readable():
    # no mechanism field, the earlier "dp-sgd" / "nu-dp-ftrl" names, a shared sketch written out
    assert PrivacyEvent.from_dict(
        {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 3}
    ) == SubsampledGaussianEvent(1.0, 0.1, 3)
    old = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 3, "mechanism": "dp-sgd"}
    assert PrivacyEvent.from_dict(old | {"sketch": "shared"}) == SubsampledGaussianEvent(
        1.0, 0.1, 3
    )
    run = {
        "noise_multiplier": 2.0,
        "sample_rate": 1.0,
        "steps": 40,
        "clipping": "exact",
        "mechanism": "nu-dp-ftrl",
        "nu": 1.0,
        "participations": 4,
        "min_separation": 10,
    }
    assert PrivacyEvent.from_dict(run) == NuDPFTRLEvent(2.0, 40, 1.0, 4, 10)
    with pytest.raises(ValueError, match="unknown event fields"):
        PrivacyEvent.from_dict(run | {"envelope": "exact"})
    # a per-example event written before its law was recorded: the legacy 0.1 % law
    hidden = old | {"clipping": "hutch", "k": 8, "sketch": "per_example"}
    assert PrivacyEvent.from_dict(hidden) == SubsampledGaussianEvent(
        1.0, 0.1, 3, "hutch", 8, sketch="per_example", scale_width=0.001
    )


def test_a_ledger_of_both_classes_is_written_as_documented():
    ledger = PrivacyLedger(
        [SubsampledGaussianEvent(1.1, 0.01, 5), NuDPFTRLEvent(2.0, 40, 1.0, 4, 10)]
    )
    expected = {
        "format": "dprc-privacy-ledger",
        "version": 1,
        "events": [EXPECTED[0][1] | {"steps": 5}, EXPECTED[3][1] | {"bands": None}],
    }
    assert ledger.to_json() == json.dumps(expected, sort_keys=True)
    assert PrivacyLedger.from_json(ledger.to_json()) == ledger


# ------------------------------------------------------------------ the PLD builder registry
@dataclass(frozen=True)
class _LaplaceEvent(PrivacyEvent):
    mechanism: ClassVar[str] = "laplace"
    noise_multiplier: float
    steps: int


def test_an_event_class_without_a_builder_is_refused():
    event = _LaplaceEvent(1.0, 3)
    assert isinstance(event, PrivacyEvent)
    with pytest.raises(UnsupportedMechanismError, match="_LaplaceEvent"):
        pld_builders.builder_for(event)
    for compute in (epsilon_for_events, epsilon_for_history):
        with pytest.raises(UnsupportedMechanismError, match="_LaplaceEvent"):
            compute([SubsampledGaussianEvent(1.0, 0.01, 3), event], DELTA)


def test_the_accountant_refuses_a_registered_class_it_does_not_declare(monkeypatch):
    monkeypatch.setattr(pld_builders, "_BUILDERS", dict(pld_builders._BUILDERS))
    monkeypatch.setattr(events, "_EVENT_TYPES", dict(events._EVENT_TYPES))  # the names too

    @pld_builders.pld_builder(_LaplaceEvent)
    class _LaplacePLD(pld_builders.PLDBuilder[_LaplaceEvent]):
        pass

    assert pld_builders.builder_for(_LaplaceEvent(1.0, 3)).__class__ is _LaplacePLD
    assert _LaplaceEvent not in SUPPORTED_EVENTS
    with pytest.raises(UnsupportedMechanismError, match="does not support _LaplaceEvent"):
        account([_LaplaceEvent(1.0, 3)], DELTA)
    with pytest.raises(ValueError, match="already has a PLD builder"):
        pld_builders.pld_builder(_LaplaceEvent)(_LaplacePLD)


def test_every_declared_event_class_has_its_builder():
    assert set(SUPPORTED_EVENTS) == {SubsampledGaussianEvent, NuDPFTRLEvent}
    assert set(SUPPORTED_EVENTS) <= set(pld_builders.registered_event_types())


# ------------------------------------------------------------------ calibration of a family
def test_calibrate_takes_any_event_family():
    q, steps = 0.01, 50
    sigma = calibrate(lambda s: SubsampledGaussianEvent(s, q, steps), 2.0, DELTA)
    assert sigma == noise_multiplier(2.0, DELTA, q, steps)

    def run(s: float) -> PrivacyEvent:
        return NuDPFTRLEvent(s, 40, 0.3, 4, 10)

    sigma = calibrate(run, 2.0, DELTA, rel_tol=1e-3)
    assert epsilon_for_events([run(sigma)], DELTA) <= 2.0
    assert epsilon_for_events([run(sigma / 1.001)], DELTA) > 2.0
    with pytest.raises(ValueError, match="needs the projection dimension k"):
        calibrate(lambda s: SubsampledGaussianEvent(s, q, steps, "hutch"), 2.0, DELTA)


# ------------------------------------------------------------------ the envelope vocabulary
def test_envelopes_is_the_one_name_of_the_family():
    assert accounting.ENVELOPES == accounting.CLIPPINGS == ("exact", "hutch", "hutchpp")
    assert check_envelope("hutch", 8, None) == ("hutch", 8, None)
    with pytest.warns(DeprecationWarning, match="check_envelope"):
        assert check_clipping("hutch", 8, None) == ("hutch", 8, None)


def test_the_clipping_keyword_warns_and_means_envelope():
    want = epsilon(1.0, 0.05, 3, DELTA, envelope="hutch", k=8)
    with pytest.warns(DeprecationWarning, match="'clipping' is deprecated, use 'envelope'"):
        assert epsilon(1.0, 0.05, 3, DELTA, clipping="hutch", k=8) == want
    with pytest.warns(DeprecationWarning, match="clipping"):
        event = PrivacyEvent(1.0, 0.05, 3, clipping="hutch", k=8)
    assert event == SubsampledGaussianEvent(1.0, 0.05, 3, "hutch", 8)
    with pytest.warns(DeprecationWarning, match="clipping"):
        assert (
            PrivacyLedger().record(
                noise_multiplier=1.0, sample_rate=0.05, steps=3, clipping="hutch", k=8
            )
            == event
        )
    with pytest.warns(DeprecationWarning, match="clipping"):
        assert dpftrl_epsilon(2.0, DELTA, 1.0, 40, 4, 10, clipping="exact") == dpftrl_epsilon(
            2.0, DELTA, 1.0, 40, 4, 10
        )
    with pytest.warns(DeprecationWarning, match="clipping"):
        assert sketch_words(clipping="exact", sketch="shared") == sketch_words("exact", "shared")
    with pytest.warns(DeprecationWarning, match="clipping"):
        assert envelope_words(clipping="hutch", k=8, rank=None) == envelope_words("hutch", 8, None)
    with pytest.warns(DeprecationWarning, match="clipping"):
        assert check_sketch("shared", clipping="hutch") == "shared"


def test_both_names_of_the_envelope_are_a_type_error():
    with pytest.raises(TypeError, match="both 'envelope' and its deprecated name 'clipping'"):
        epsilon(1.0, 0.05, 3, DELTA, envelope="hutch", clipping="hutch", k=8)
    with pytest.raises(TypeError, match="both"):
        epsilon(1.0, 0.05, 3, DELTA, "hutch", clipping="hutch", k=8)  # positional envelope
    with pytest.raises(TypeError, match="both"):
        noise_multiplier(2.0, DELTA, 0.05, 3, envelope="exact", clipping="exact")
    with pytest.raises(TypeError, match="both"):
        PrivacyEvent(1.0, 0.05, 3, envelope="hutch", clipping="hutch", k=8)
    with pytest.raises(TypeError, match="both"):
        PrivacyEvent(1.0, 0.05, 3, "hutch", clipping="hutch", k=8)


def test_cli_clipping_option_is_the_envelope_with_a_note(capsys):
    argv = "accountant epsilon --sigma 1 --delta 1e-5 -q 0.05 --steps 3 --k 8 --json".split()
    assert main([*argv, "--envelope", "hutch"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    new = json.loads(out.out)
    assert main([*argv, "--clipping", "hutch"]) == 0
    out = capsys.readouterr()
    assert out.err.strip() == "dprc: note: --clipping is deprecated, use --envelope"
    assert json.loads(out.out) == new and new["clipping"] == "hutch"
