"""The mechanism objects as JSON (what a service stores with a job and its worker reads back),
and the job spec's one mapping to and from them."""

from __future__ import annotations

import json

import pytest

from dprc_core.clipping import Auto, Clipping, Exact, Hutch, HutchPP
from dprc_core.noise import Gaussian, NuDPFTRL, noise_from_dict
from dprc_core.training.runner import JobSpec, mechanism_fields

CLIPPINGS = [
    Clipping(1.0, Exact()),
    Clipping(0.5, Exact("ghost"), "two_pass", False),
    Clipping(1.0, Hutch(8)),
    Clipping(2.0, Hutch(8, "shared")),
    Clipping(1.0, HutchPP(4, "shared")),
    Clipping(3.0, Auto(64, 16)),
]
NOISES = [Gaussian(1.2), Gaussian(0.5, secure=True), NuDPFTRL(1.0, nu=0.1, bands=4)]


@pytest.mark.parametrize("clipping", CLIPPINGS, ids=repr)
def test_a_clipping_survives_json(clipping):
    text = json.dumps(clipping.to_dict())
    assert Clipping.from_dict(json.loads(text)) == clipping


@pytest.mark.parametrize("noise", NOISES, ids=repr)
def test_a_noise_mechanism_survives_json(noise):
    assert noise_from_dict(json.loads(json.dumps(noise.to_dict()))) == noise


def test_malformed_objects_are_refused_naming_what_is_wrong():
    good = Clipping(1.0, Hutch(8)).to_dict()
    with pytest.raises(ValueError, match="unknown \\['norm'\\]"):
        Clipping.from_dict({**good, "norm": "hutch"})
    with pytest.raises(ValueError, match="missing \\['max_grad_norm'\\]"):
        Clipping.from_dict({k: v for k, v in good.items() if k != "max_grad_norm"})
    with pytest.raises(ValueError, match="per_example"):
        Clipping.from_dict({**good, "norm_method": "exact", "k": None})  # per_example, exact
    with pytest.raises(ValueError, match="max_grad_norm"):
        Clipping.from_dict({**good, "max_grad_norm": -1})
    with pytest.raises(ValueError, match="mechanism must be one of"):
        noise_from_dict({"mechanism": "laplace", "noise_multiplier": 1.0})
    with pytest.raises(ValueError, match="unknown gaussian fields"):
        noise_from_dict({"mechanism": "gaussian", "noise_multiplier": 1.0, "nu": 0.1})
    with pytest.raises(ValueError, match="noise_multiplier"):
        noise_from_dict({"mechanism": "gaussian", "noise_multiplier": float("nan")})
    with pytest.raises(ValueError, match="a clipping must be a JSON object"):
        Clipping.from_dict([1.0])


@pytest.mark.parametrize(
    ("clipping", "noise"),
    [
        (Clipping(1.0, Exact()), Gaussian(1.1)),
        (Clipping(0.7, Hutch(8, "shared")), Gaussian(0.9, secure=True)),
        (Clipping(1.0, HutchPP(4)), Gaussian(2.0)),
        (Clipping(1.0, Auto(32, 16, "shared")), Gaussian(1.0)),
        (Clipping(1.0, Exact()), NuDPFTRL(1.3, nu=0.2, bands=8)),
    ],
    ids=repr,
)
def test_the_job_spec_runs_the_objects_it_was_given(clipping, noise, tmp_path):
    fields = mechanism_fields(clipping, noise)
    spec = JobSpec(
        model="m",
        task="causal_lm",
        train_file="t.jsonl",
        output_dir=str(tmp_path),
        **{"max_seq_len": 128, **fields},
    )
    assert spec.mechanisms(noise.noise_multiplier) == (clipping, noise)


def test_a_job_spec_cannot_say_what_the_runner_does_not_run():
    with pytest.raises(ValueError, match="two_pass"):
        mechanism_fields(Clipping(1.0, Exact(), "two_pass"), Gaussian(1.0))
    with pytest.raises(ValueError, match="check_independence"):
        mechanism_fields(Clipping(1.0, Exact(), check_independence=False), Gaussian(1.0))
