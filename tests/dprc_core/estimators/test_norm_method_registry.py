"""The norm-method registry: a method added with one registration is validated, run by the
engine on every 2-D parameter and accounted with the envelope it names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Clipping, Gaussian, Sketched
from dprc_core.estimators import hutch_sq_norms
from dprc_core.norm_methods import NORM_METHODS, envelope_for


@pytest.fixture()
def hutch64():
    calls = []

    def estimate(contribs, k, generator, dtype):
        calls.append(k)
        return hutch_sq_norms(contribs, k, generator=generator, dtype=torch.float64)

    dprc_core.register_norm_method(
        dprc_core.NormMethod("hutch64", randomized=True, envelope="hutch", estimate=estimate)
    )
    yield calls
    del NORM_METHODS["hutch64"]


def test_a_registered_method_runs_and_is_accounted_with_its_envelope(hutch64):
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = dprc_core.PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, Sketched("hutch64", k=4)),
        noise=Gaussian(1.0),
        expected_batch_size=4,
        seed=0,
    )
    stats = engine.step(lambda m, x: m(x).pow(2).sum(1), torch.randn(4, 4))
    assert stats.methods == {
        "0.weight": "hutch64",
        "0.bias": "exact",
        "2.weight": "hutch64",
        "2.bias": "exact",
    }
    assert engine.accounting_envelope == "hutch" and engine.randomized
    # 2 parameters × (3 passes of the independence check + 1 training pass), all with k = 4
    assert hutch64 == [4] * 8
    with pytest.raises(ValueError, match="k.*>= 2"):
        dprc_core.PrivacyEngine(
            model,
            opt,
            clipping=Clipping(1.0, Sketched("hutch64", k=1)),
            noise=Gaussian(1.0),
            expected_batch_size=4,
        )


def test_unknown_methods_and_envelopes_are_refused():
    with pytest.raises(ValueError, match="unknown norm method 'nope'"):
        dprc_core.per_sample_grad_norms(
            nn.Linear(2, 2), lambda m, x: m(x).sum(1), torch.randn(2, 2), method="nope"
        )
    with pytest.raises(ValueError, match="envelope"):
        dprc_core.register_norm_method(dprc_core.NormMethod("x", True, "made-up", None))
    assert "x" not in NORM_METHODS


def test_a_mixed_plan_is_accounted_with_its_strongest_envelope():
    assert envelope_for({"exact", "fgc"}) == "exact"
    assert envelope_for({"ghost", "hutch"}) == "hutch"
    assert envelope_for({"hutch", "hutchpp", "exact"}) == "hutchpp"
