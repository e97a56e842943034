"""The engine built from mechanism objects (``clipping=Clipping(...)``, ``noise=Gaussian(...) |
NuDPFTRL(...)``): the same updates as the deprecated keyword form, one DeprecationWarning for
that form and none for the objects, invalid combinations refused where they are written, and
``privacy_event`` equal to the event the planner (hence the runner) builds."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Auto, Clipping, Exact, Gaussian, Hutch, HutchPP, NuDPFTRL, PrivacyEngine
from dprc_core.accounting import PrivacyEvent
from dprc_core.accounting.events import default_sketch
from dprc_core.clipping import Sketched, norm_from_method
from dprc_core.engine import accounting_envelope_for, layer_methods
from dprc_core.integrations.privacy_arguments import PrivacyArguments
from dprc_core.noise import SecureStream
from dprc_core.training.plan import plan_privacy

KEY = bytes(range(32))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x).pow(2).sum(-1)


def train(secure: bool = False, steps: int = 3, **engine_kw) -> list[torch.Tensor]:
    """Parameters after ``steps`` steps (batches of 5, example ids for per-example sketches)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stream = {"secure_stream": SecureStream(KEY)} if secure else {}
    engine = PrivacyEngine(model, opt, expected_batch_size=5, seed=7, **stream, **engine_kw)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        batch = torch.randn(5, 6, generator=g, dtype=torch.float64)
        engine.step(loss_fn, batch, example_ids=list(range(5 * step, 5 * step + 5)))
    engine.detach()
    return [p.detach().clone() for p in model.parameters()]


# (keyword form, new form) pairs that must give the same run
CASES = {
    "exact": (
        dict(max_grad_norm=0.5, noise_multiplier=1.0, norm_method="exact"),
        dict(clipping=Clipping(0.5, Exact()), noise=Gaussian(1.0)),
    ),
    "hutch_per_example": (
        dict(max_grad_norm=0.5, noise_multiplier=1.0, norm_method="hutch", k=4),
        dict(clipping=Clipping(0.5, Hutch(4)), noise=Gaussian(1.0)),
    ),
    "hutch_shared": (
        dict(max_grad_norm=0.5, noise_multiplier=1.0, norm_method="hutch", k=4, sketch="shared"),
        dict(clipping=Clipping(0.5, Hutch(4, sketch="shared")), noise=Gaussian(1.0)),
    ),
    "hutchpp": (
        dict(max_grad_norm=0.5, noise_multiplier=1.0, norm_method="hutchpp", k=6),
        dict(clipping=Clipping(0.5, HutchPP(6)), noise=Gaussian(1.0)),
    ),
    "auto": (
        dict(max_grad_norm=0.5, noise_multiplier=1.0, norm_method="auto", k=4, max_seq_len=3),
        dict(clipping=Clipping(0.5, Auto(3, k=4)), noise=Gaussian(1.0)),
    ),
    "two_pass": (
        dict(
            max_grad_norm=0.5,
            noise_multiplier=1.0,
            norm_method="hutch",
            k=4,
            clipping_mode="two_pass",
        ),
        dict(clipping=Clipping(0.5, Hutch(4), clipped_sum="two_pass"), noise=Gaussian(1.0)),
    ),
    "nu_dpftrl": (
        dict(
            max_grad_norm=0.5,
            noise_multiplier=1.0,
            norm_method="exact",
            noise_mechanism=NuDPFTRL(nu=0.3, bands=2),
        ),
        dict(clipping=Clipping(0.5, Exact()), noise=NuDPFTRL(1.0, 0.3, 2)),
    ),
    "nu_dpftrl_by_name": (
        dict(
            max_grad_norm=0.5,
            noise_multiplier=1.0,
            norm_method="exact",
            noise_mechanism="nu_dpftrl",
            nu=0.3,
        ),
        dict(clipping=Clipping(0.5, Exact()), noise=NuDPFTRL(1.0, nu=0.3)),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_objects_and_the_keywords_give_bit_identical_parameters(case):
    old_kw, new_kw = CASES[case]
    with pytest.warns(DeprecationWarning):
        old = train(**old_kw)
    new = train(**new_kw)
    for a, b in zip(old, new, strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(new, train(steps=0, **new_kw), strict=True))


@pytest.mark.parametrize("sketch", ["per_example", "shared"])
def test_secure_gaussian_objects_and_keywords_give_bit_identical_parameters(sketch):
    with pytest.warns(DeprecationWarning):
        old = train(
            secure=True,
            max_grad_norm=0.5,
            noise_multiplier=1.0,
            norm_method="hutch",
            k=4,
            secure_rng=True,
            sketch=sketch,
        )
    new = train(
        secure=True,
        clipping=Clipping(0.5, Hutch(4, sketch=sketch)),
        noise=Gaussian(1.0, secure=True),
    )
    for a, b in zip(old, new, strict=True):
        assert torch.equal(a, b)
    # the keystream, not the seed, drives the noise
    seeded = train(clipping=Clipping(0.5, Hutch(4, sketch=sketch)), noise=Gaussian(1.0))
    assert not torch.equal(new[0], seeded[0])


def _engine(**kw) -> PrivacyEngine:
    model = make_model()
    return PrivacyEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), **kw)


def test_the_keyword_form_warns_once_and_the_objects_do_not_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _engine(max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=4)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1
    assert "clipping=" in str(deprecations[0].message)
    assert deprecations[0].filename == __file__  # points at the caller
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _engine(max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=4,
                noise_mechanism="nu_dpftrl", nu=0.2, norm_method="exact")  # fmt: skip
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = _engine(
            clipping=Clipping(1.0, Hutch(4)), noise=Gaussian(1.0), expected_batch_size=4
        )
        engine.step(loss_fn, torch.randn(4, 6, dtype=torch.float64))
        assert engine.layer_methods["0.weight"] == "hutch"
        assert engine.accounting_envelope == "hutch" and engine.clipped_sum == "bookkeeping"
        assert engine.privacy_event(1, 0.1).sketch == "per_example"


def test_the_engine_gives_back_its_objects_and_keeps_its_attributes():
    clipping = Clipping(0.5, Auto(3, k=4, sketch="shared"), clipped_sum="two_pass")
    noise = Gaussian(1.5)
    engine = _engine(clipping=clipping, noise=noise, expected_batch_size=4, seed=3)
    assert engine.clipping is clipping and engine.mechanism is noise
    assert (engine.max_grad_norm, engine.noise_multiplier, engine.expected_batch_size) == (
        0.5,
        1.5,
        4.0,
    )
    assert (engine.norm_method, engine.k, engine.sketch, engine.max_seq_len) == (
        "auto",
        4,
        "shared",
        3,
    )
    assert engine.noise_mechanism == "gaussian" and not engine.secure_rng
    assert engine.check_independence and engine.accounting_sketch == "shared"
    assert engine.state_dict()["seed"] == 3
    # the old names: the same values, each with a DeprecationWarning
    with pytest.warns(DeprecationWarning, match="clipped_sum"):
        assert engine.clipping_mode == "two_pass"
    with pytest.warns(DeprecationWarning, match="layer_methods"):
        assert engine.norm_plan == engine.layer_methods
    with pytest.warns(DeprecationWarning, match="accounting_envelope"):
        assert engine.accounting_clipping == engine.accounting_envelope
    with pytest.warns(DeprecationWarning, match="layer_methods"):
        assert dprc_core.engine.norm_plan(make_model(), "hutch", 4) == layer_methods(
            make_model(), Hutch(4)
        )
    with pytest.warns(DeprecationWarning, match="accounting_envelope_for"):
        assert dprc_core.engine.accounting_clipping_for({"a": "hutch"}) == "hutch"


def test_the_sketch_default_is_default_sketch():
    assert Hutch().sketch == HutchPP().sketch == Auto(8).sketch == default_sketch(True)
    assert Exact().sketch == default_sketch(False)
    assert Clipping(1.0).norm == Hutch(32, default_sketch(True))
    assert norm_from_method("exact", sketch="shared") == Exact()


# ------------------------------------------------------------------ invalid combinations
@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: Hutch(1), ValueError, ">= 2"),
        (lambda: HutchPP(k=1), ValueError, ">= 2"),
        (lambda: Auto(4, k=1), ValueError, ">= 2"),
        (lambda: Hutch(2.5), ValueError, "k"),
        (lambda: Hutch(4, sketch="per-example"), ValueError, "sketch must be one of"),
        (lambda: Auto(0), ValueError, "max_seq_len"),
        (lambda: Auto(True), ValueError, "max_seq_len"),
        (lambda: Exact("hutch"), ValueError, "exact norm method"),
        (lambda: Exact("magic"), ValueError, "unknown norm method"),
        (lambda: Sketched("exact"), ValueError, "randomized"),
        (lambda: Sketched("auto"), ValueError, "Auto"),
        (lambda: Clipping(0.0), ValueError, "max_grad_norm"),
        (lambda: Clipping(float("inf")), ValueError, "max_grad_norm"),
        (lambda: Clipping(True), ValueError, "max_grad_norm"),
        (lambda: Clipping(1.0, "hutch"), TypeError, "norm must be"),
        (lambda: Clipping(1.0, clipped_sum="lazy"), ValueError, "clipped_sum"),
        (lambda: Gaussian(-1.0), ValueError, "noise_multiplier"),
        (lambda: Gaussian(float("nan")), ValueError, "noise_multiplier"),
        (lambda: NuDPFTRL(1.0), ValueError, "needs nu"),
        (lambda: NuDPFTRL(1.0, 1.5), ValueError, "nu must be"),
        (lambda: NuDPFTRL(1.0, 0.5, 0), ValueError, "bands"),
        (lambda: NuDPFTRL(1.0, 0.5, secure=True), TypeError, "secure"),
    ],
)
def test_invalid_objects_are_refused_where_they_are_written(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("norm", [Hutch(4), HutchPP(4), Auto(4, k=4)])
def test_randomized_norms_with_correlated_noise_are_refused(norm):
    with pytest.raises(ValueError, match="correlated noise"):
        _engine(clipping=Clipping(1.0, norm), noise=NuDPFTRL(1.0, 0.1), expected_batch_size=4)


def test_the_engine_refuses_incomplete_or_mixed_forms():
    objects = dict(clipping=Clipping(1.0, Exact()), noise=Gaussian(1.0))
    with pytest.raises(TypeError, match="not both"):
        _engine(**objects, expected_batch_size=4, max_grad_norm=1.0)
    with pytest.raises(TypeError, match="not both"):
        _engine(noise=Gaussian(1.0), expected_batch_size=4, norm_method="exact")
    with pytest.raises(TypeError, match="needs noise="):
        _engine(clipping=objects["clipping"], expected_batch_size=4)
    with pytest.raises(TypeError, match="needs clipping="):
        _engine(noise=objects["noise"], expected_batch_size=4)
    with pytest.raises(ValueError, match="needs its noise_multiplier"):
        _engine(clipping=objects["clipping"], noise=Gaussian(), expected_batch_size=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sigma'"):
        _engine(**objects, expected_batch_size=4, sigma=1.0)
    with pytest.raises(ValueError, match="expected_batch_size"):
        _engine(**objects, expected_batch_size=0)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="secure_rng=True"):
        _engine(
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            expected_batch_size=4,
            norm_method="exact",
            noise_mechanism=NuDPFTRL(nu=0.1),
            secure_rng=True,
        )
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="without its"):
        _engine(
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            expected_batch_size=4,
            noise_mechanism=Gaussian(2.0),
        )


# ------------------------------------------------------------------ privacy events
@pytest.mark.parametrize(
    "norm", [Exact(), Hutch(4), Hutch(4, sketch="shared"), HutchPP(4), Auto(1, k=4), Auto(3, 4)]
)
def test_privacy_event_is_the_planners_event(norm):
    model = make_model()
    methods = layer_methods(model, norm)
    envelope = accounting_envelope_for(methods)
    # as the runner plans: an exact plan draws nothing per example
    sketch = norm.sketch if envelope != "exact" else default_sketch(randomized=False)
    plan = plan_privacy(
        dataset_size=200,
        batch_size=10,
        epochs=2,
        clipping=envelope,
        k=4,
        target_epsilon=3.0,
        sketch=sketch,
    )
    engine = _engine(
        clipping=Clipping(1.0, norm),
        noise=Gaussian(plan.noise_multiplier),
        expected_batch_size=plan.batch_size,
    )
    assert engine.accounting_envelope == envelope
    for steps in (1, 7, plan.steps):
        assert engine.privacy_event(steps, plan.sample_rate) == plan.event(steps)
    assert isinstance(plan.event(), PrivacyEvent)
    with pytest.raises(ValueError, match="sample_rate"):
        engine.privacy_event(3)
    with pytest.raises(ValueError, match="min_separation"):
        engine.privacy_event(3, plan.sample_rate, min_separation=5)


def test_nu_dpftrl_privacy_event_is_the_planners_event():
    plan = plan_privacy(
        dataset_size=40,
        batch_size=8,
        epochs=3,
        clipping="exact",
        k=None,
        noise_multiplier_value=2.0,
        mechanism="nu_dpftrl",
        nu=0.2,
        bands=3,
    )
    engine = _engine(
        clipping=Clipping(1.0, Exact()),
        noise=NuDPFTRL(plan.noise_multiplier, plan.nu, plan.bands),
        expected_batch_size=plan.batch_size,
    )
    for steps in (1, 5, 6, plan.steps):
        assert engine.privacy_event(steps, min_separation=plan.min_separation) == plan.event(steps)
    with pytest.raises(ValueError, match="min_separation"):
        engine.privacy_event(3)


def test_no_privacy_event_without_noise():
    with pytest.warns(dprc_core.PrivacyWarning):
        engine = _engine(clipping=Clipping(1.0), noise=Gaussian(0.0), expected_batch_size=4)
    with pytest.raises(ValueError, match="not private"):
        engine.privacy_event(1, 0.1)


def test_privacy_arguments_build_the_objects():
    args = PrivacyArguments(noise_multiplier=1.0, norm_method="hutchpp", k=8, sketch="shared")
    assert args.clipping() == Clipping(1.0, HutchPP(8, "shared"))
    assert args.noise(1.0) == Gaussian(1.0)
    nu = PrivacyArguments(noise_multiplier=1.0, norm_method="exact", clipped_sum="two_pass",
                          noise_mechanism="nu_dpftrl", nu=0.5, bands=4)  # fmt: skip
    assert nu.clipping() == Clipping(1.0, Exact(), clipped_sum="two_pass")
    assert nu.noise(2.0) == NuDPFTRL(2.0, 0.5, 4)
    with pytest.warns(DeprecationWarning, match="clipped_sum"):
        old = PrivacyArguments(noise_multiplier=1.0, clipping_mode="two_pass")
    assert old.clipped_sum == "two_pass"
    with pytest.raises(ValueError, match="clipped_sum"):
        PrivacyArguments(noise_multiplier=1.0, clipped_sum="lazy")
