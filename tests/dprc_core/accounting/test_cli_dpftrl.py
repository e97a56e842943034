"""``dprc accountant epsilon|sigma --mechanism nu-dpftrl``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from scipy import special

from dprc_core.cli import main


def dense_sensitivity(nu: float, steps: int, k: int, sep: int, bands=None) -> float:
    lag = np.subtract.outer(np.arange(steps), np.arange(steps))
    a = np.abs(lag)
    b = np.where(lag >= 0, (-1.0) ** a * special.binom(0.5, a) * (1 - nu) ** a, 0.0)
    if bands is not None:
        b = np.where(lag < bands, b, 0.0)
    inv = np.linalg.inv(b)
    return float(np.linalg.norm(inv[:, [j * sep for j in range(k)]].sum(axis=1)))


def run_json(capsys, argv: str) -> dict:
    rc = main(argv.split() + ["--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def test_sigma_from_dataset_size_batch_and_epochs(capsys):
    res = run_json(
        capsys,
        "accountant sigma --mechanism nu-dpftrl --nu 0.05 --bands 16 --epsilon 2 --delta 1e-5 "
        "--dataset-size 1800 --batch-size 32 --epochs 3",
    )
    # fixed-order batches: ⌈1800/32⌉ = 57 steps per epoch, 3 participations 57 apart
    assert (res["steps"], res["participations"], res["min_separation"]) == (171, 3, 57)
    sens = dense_sensitivity(0.05, 171, 3, 57, bands=16)
    assert res["sensitivity"] == pytest.approx(sens, rel=1e-8)
    sigma = res["noise_multiplier"]
    delta_at_target = GaussianPrivacyLoss(sigma, sensitivity=sens).get_delta_for_epsilon(2.0)
    assert delta_at_target <= 1e-5 * (1 + 1e-8)
    assert delta_at_target == pytest.approx(1e-5, rel=1e-6)
    assert res["epsilon"] <= 2.0 and res["mechanism"] == "nu_dpftrl" and res["bands"] == 16


def test_epsilon_with_explicit_pattern(capsys):
    res = run_json(
        capsys,
        "accountant epsilon --mechanism nu-dpftrl --nu 0.1 --sigma 1.5 --delta 1e-6 "
        "--steps 120 --participations 4 --min-separation 30",
    )
    sens = dense_sensitivity(0.1, 120, 4, 30)
    loss = GaussianPrivacyLoss(1.5, sensitivity=sens)
    assert loss.get_delta_for_epsilon(res["epsilon"]) == pytest.approx(1e-6, rel=1e-6)
    # the alias spelling is accepted and the text output names the mechanism
    rc = main(
        "accountant epsilon --mechanism nu-dp-ftrl --nu 0.1 --sigma 1.5 --delta 1e-6 "
        "--steps 120 --participations 4 --min-separation 30".split()
    )
    out = capsys.readouterr().out
    assert rc == 0 and "nu_dpftrl" in out and "sensitivity:" in out


def test_dp_sgd_default_is_unchanged(capsys):
    argv = "accountant epsilon --sigma 1.0 -q 0.01 --steps 100 --delta 1e-5"
    plain = run_json(capsys, argv)
    explicit = run_json(capsys, argv + " --mechanism dp-sgd")
    assert plain == explicit and "mechanism" not in plain


BASE = "accountant epsilon --mechanism nu-dpftrl --sigma 1 --delta 1e-5 "


@pytest.mark.parametrize(
    "argv,match",
    [
        (
            BASE + "--nu 0.1 --steps 10 --participations 1 --min-separation 10 --envelope hutch "
            "--k 8",
            "randomized clipping",
        ),
        (BASE + "--nu 0.1 --steps 10 -q 0.1", "--sample-rate does not apply"),
        (BASE + "--steps 10 --participations 1 --min-separation 10", "needs --nu"),
        (BASE + "--nu 0.1 --steps 10", "--participations and --min-separation"),
        (BASE + "--nu 0.1 --dataset-size 10 --batch-size 2 --epochs 1 --steps 5", "not both"),
        (BASE + "--nu 0.1 --dataset-size 10 --batch-size 2", "go together"),
        (BASE + "--nu 0.1 --dataset-size 10 --batch-size 20 --epochs 1", "batch-size"),
        (BASE + "--nu 1.5 --steps 10 --participations 1 --min-separation 10", "nu must be"),
        (BASE + "--nu 0.1 --bands 0 --steps 10 --participations 1 --min-separation 10", "bands"),
        (
            "accountant epsilon --sigma 1 --delta 1e-5 -q 0.01 --steps 10 --nu 0.1",
            "only for --mechanism nu_dpftrl",
        ),
        (
            "accountant sigma --epsilon 1 --delta 1e-5 -q 0.01 --steps 10 --bands 4",
            "only for --mechanism nu_dpftrl",
        ),
    ],
)
def test_errors_are_one_clear_line(capsys, argv, match):
    rc = main(argv.split())
    err = capsys.readouterr().err
    assert rc == 2
    assert match in err and len(err.strip().splitlines()) == 1
