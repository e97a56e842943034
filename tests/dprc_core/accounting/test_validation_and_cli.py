"""Input validation of the public functions and the ``dprc accountant`` CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dprc_core import accounting
from dprc_core.cli import main


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.01}, "sample_rate"),
        ({"steps": 0}, "steps"),
        ({"steps": 10.0}, "steps"),
        ({"steps": True}, "steps"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"envelope": "ghost"}, "clipping"),
        ({"envelope": "hutch"}, "projection dimension k"),
        ({"envelope": "hutch", "k": 0}, "k must be"),
        ({"envelope": "hutch", "k": 1}, "k must be >= 2"),
        ({"envelope": "hutchpp", "k": 8.5}, "integer"),
        ({"envelope": "hutch", "k": 8, "rank": 0}, "rank"),
        ({"k": 8}, "only meaningful for randomized clipping"),
        ({"rank": 4}, "only meaningful for randomized clipping"),
    ],
)
def test_epsilon_validates(kwargs, match):
    args = {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 100, "delta": 1e-5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        accounting.epsilon(**args)


def test_numpy_scalars_are_accepted():
    a = accounting.epsilon(
        np.float64(1.0), np.float32(0.01), np.int64(100), 1e-5, "hutch", np.int32(16)
    )
    assert a == pytest.approx(
        accounting.epsilon(1.0, float(np.float32(0.01)), 100, 1e-5, "hutch", 16)
    )


@pytest.mark.parametrize("target,match", [(0.0, "target epsilon"), (-1.0, "target epsilon")])
def test_noise_multiplier_validates(target, match):
    with pytest.raises(ValueError, match=match):
        accounting.noise_multiplier(target, 1e-5, 0.01, 100)
    with pytest.raises(ValueError, match="delta"):
        accounting.noise_multiplier(1.0, 2.0, 0.01, 100)
    with pytest.raises(ValueError, match="k must be"):
        accounting.noise_multiplier(1.0, 1e-5, 0.01, 100, "hutch", 0)


def test_x_plus_and_envelope_validate():
    with pytest.raises(ValueError):
        accounting.x_plus(8, None)
    with pytest.raises(ValueError):
        accounting.x_plus(8, accounting.RANK_ENVELOPE_MAX + 1)
    with pytest.raises(ValueError):
        accounting.envelope_cdf(1.0, 1)
    assert accounting.x_plus(8, 1) == 1.0


def test_cli_epsilon_prints_result_and_settings(capsys):
    rc = main(
        [
            "accountant",
            "epsilon",
            "--sigma",
            "1.0",
            "--sample-rate",
            "0.01",
            "--steps",
            "1000",
            "--delta",
            "1e-5",
            "--envelope",
            "hutch",
            "--k",
            "32",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    value = accounting.epsilon(1.0, 0.01, 1000, 1e-5, "hutch", 32)
    assert f"epsilon = {value:.6g}" in out
    for word in (
        "noise_multiplier: 1.0",
        "sample_rate: 0.01",
        "steps: 1000",
        "clipping: hutch",
        "k: 32",
        "dimension-free",
        "loss grid h=",
    ):
        assert word in out


# the README's example job: N = 1800, B = 32, 3 epochs, target (2, 1e-5)
README_SIGMA = (
    "accountant sigma --epsilon 2 --delta 1e-5 --dataset-size 1800 --batch-size 32 --epochs 3"
).split()


def test_cli_sigma_json_with_dataset_size(capsys):
    rc = main([*README_SIGMA, "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0
    # the job's step rule, ceil(epochs·N/B) = ceil(168.75) = 169 (it was 3·ceil(N/B) = 171)
    assert result["steps"] == math.ceil(3 * 1800 / 32) == 169
    assert result["sample_rate"] == pytest.approx(32 / 1800)
    assert result["epsilon"] <= 2.0
    assert result["noise_multiplier"] == pytest.approx(
        accounting.noise_multiplier(2.0, 1e-5, 32 / 1800, 169), rel=1e-12
    )


def test_cli_sigma_plans_exactly_the_steps_the_job_runs(capsys):
    """The README's example: `dprc accountant sigma` and `dprc train` / the service (the
    planner the runner executes) agree on the step count and hence on sigma."""
    from dprc_core.training.plan import plan_privacy

    # a hutch job runs per-example sketches by default; the accountant's own default is the
    # shared-sketch bound, valid for both, hence at least as large
    argv = [*README_SIGMA, "--envelope", "hutch", "--k", "32", "--sketch", "per_example", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert main([*README_SIGMA, "--envelope", "hutch", "--k", "32", "--json"]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert shared["sketch"].startswith("shared")
    assert shared["noise_multiplier"] > result["noise_multiplier"]
    plan = plan_privacy(
        dataset_size=1800,
        batch_size=32,
        epochs=3,
        clipping="hutch",
        k=32,
        target_epsilon=2.0,
        delta=1e-5,
    )
    assert result["steps"] == plan.steps
    assert result["noise_multiplier"] == pytest.approx(plan.noise_multiplier, rel=1e-12)


@pytest.mark.parametrize(
    "argv,match",
    [
        (
            "accountant epsilon --sigma 1 --delta 1e-5 -q 0.01 --steps 10 --k 8".split(),
            "only meaningful",
        ),
        (
            "accountant epsilon --sigma 1 --delta 1e-5 -q 0.01".split(),
            "--sample-rate and --steps",
        ),
        (
            "accountant sigma --epsilon 1e-3 --delta 1e-5 -q 1 --steps 100000".split(),
            "no noise multiplier",
        ),
        (
            "accountant epsilon --sigma 1 --delta 1e-5 -q 0.01 --steps 10 --epochs 2".split(),
            "not both",
        ),
    ],
)
def test_cli_errors_are_one_clear_line(capsys, argv, match):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("dprc: error:") and match in err and err.count("\n") == 1


def test_cli_sketch_per_example(capsys):
    base = [*README_SIGMA, "--envelope", "hutch", "--k", "32", "--json"]
    assert main([*base, "--sketch", "per_example"]) == 0
    per = json.loads(capsys.readouterr().out)
    assert main(base) == 0
    shared = json.loads(capsys.readouterr().out)
    q, steps = 32 / 1800, 169
    want = accounting.noise_multiplier(2.0, 1e-5, q, steps, "hutch", 32, sketch="per_example")
    assert per["noise_multiplier"] == want < shared["noise_multiplier"]
    assert "hidden-scale" in per["sketch"] and "hidden-scale" not in shared["sketch"]
    # per-example sketches with exact norms: refused in one line
    assert main([*README_SIGMA, "--sketch", "per_example"]) == 2
    assert "randomized clipping" in capsys.readouterr().err


def test_cli_server_request_carries_the_sketch():
    import argparse

    from dprc_core.accounting.cli import add_subparser, api_request

    parser = argparse.ArgumentParser()
    add_subparser(parser.add_subparsers(dest="command"))
    argv = [*README_SIGMA, "--envelope", "hutch", "--k", "32"]
    body = api_request(parser.parse_args([*argv, "--sketch", "per_example"]), "sigma")
    assert body["sketch"] == "per_example"
    assert "sketch" not in api_request(parser.parse_args(argv), "sigma")  # the server default
