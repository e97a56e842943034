"""The DP label histogram: sensitivity 1 per unit (brute force over every unit removed), the
noise's moments (Monte Carlo), σ_h against the Gaussian mechanism's exact privacy profile
(Balle & Wang 2018), and its composition with DP-SGD's steps against Google dp_accounting."""

from __future__ import annotations

import math
import random

import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as dpl
from scipy.stats import norm

from dprc_core.accounting import epsilon_for_events
from dprc_core.accounting.events import SubsampledGaussianEvent
from dprc_core.synthetic.labels import (
    LabelHistogram,
    histogram_event,
    histogram_sigma,
    release_label_histogram,
    unit_contributions,
)

CLASSES = ["a", "b", "c"]


def _data(seed: int, n: int = 60):
    rng = random.Random(seed)
    labels = [rng.choice(CLASSES) for _ in range(n)]
    users = [f"u{rng.randrange(12)}" for _ in range(n)]
    return labels, users


@pytest.mark.parametrize("seed", range(3))
def test_removing_any_unit_moves_the_histogram_by_at_most_one(seed):
    labels, users = _data(seed)
    whole_ex = unit_contributions(labels, CLASSES)
    assert whole_ex.tolist() == [labels.count(c) for c in CLASSES]
    for i in range(len(labels)):
        rest = unit_contributions(labels[:i] + labels[i + 1 :], CLASSES)
        assert torch.linalg.vector_norm(whole_ex - rest) <= 1 + 1e-12
    whole = unit_contributions(labels, CLASSES, users)
    moved = []
    for u in set(users):
        keep = [j for j, v in enumerate(users) if v != u]
        rest = unit_contributions([labels[j] for j in keep], CLASSES, [users[j] for j in keep])
        moved.append(float(torch.linalg.vector_norm(whole - rest)))
    assert max(moved) <= 1 + 1e-12
    assert math.isclose(float(whole.sum()), len(set(users)))  # one unit of mass per user


def test_noise_has_the_stated_standard_deviation():
    labels = ["a"] * 30 + ["b"] * 10
    draws = torch.tensor(
        [release_label_histogram(labels, CLASSES, 3.0, seed=s).noisy_counts for s in range(3000)]
    )
    mean, std = draws.mean(0), draws.std(0)
    assert torch.allclose(mean, torch.tensor([30.0, 10.0, 0.0]), atol=4 * 3 / math.sqrt(3000))
    assert torch.allclose(std, torch.full((3,), 3.0), rtol=0.06)


def test_secure_noise_by_default():
    a = release_label_histogram(["a", "b"], CLASSES, 2.0)
    b = release_label_histogram(["a", "b"], CLASSES, 2.0)
    assert a.noisy_counts != b.noisy_counts
    assert all(math.isfinite(c) for c in a.noisy_counts)


def _gaussian_delta(eps: float, sigma: float) -> float:
    """The exact δ(ε) of the Gaussian mechanism with sensitivity 1 (Balle & Wang, Thm 8)."""
    return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(
        -0.5 / sigma - eps * sigma
    )


@pytest.mark.parametrize("eps, delta", [(0.1, 1e-5), (0.5, 1e-6), (2.0, 1e-3)])
def test_histogram_sigma_meets_the_exact_gaussian_profile(eps, delta):
    sigma = histogram_sigma(eps, delta)
    assert _gaussian_delta(eps, sigma) <= delta
    # and is not wastefully large: 1 % less noise already breaks the target
    assert _gaussian_delta(eps, sigma / 1.01) > delta * 0.999


def test_composition_with_training_matches_dp_accounting():
    sigma, q, steps, sigma_h, delta = 1.1, 0.05, 200, 12.0, 1e-5
    ours = epsilon_for_events(
        [SubsampledGaussianEvent(sigma, q, steps), histogram_event(sigma_h)], delta
    )
    train = dpl.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-4, pessimistic_estimate=True
    ).self_compose(steps)
    hist = dpl.from_gaussian_mechanism(
        sigma_h, value_discretization_interval=1e-4, pessimistic_estimate=True
    )
    ref = train.compose(hist).get_epsilon_for_delta(delta)
    alone = train.get_epsilon_for_delta(delta)
    assert ref > alone  # the histogram costs something
    assert ref * 0.995 <= ours <= ref * 1.01


def test_distribution_is_post_processing_of_the_counts():
    h = LabelHistogram(("a", "b", "c"), (30.0, -4.0, 10.0), 2.0)
    assert h.distribution() == pytest.approx((0.75, 0.0, 0.25))
    assert LabelHistogram(("a", "b"), (-1.0, -2.0), 2.0).distribution() == (0.5, 0.5)
    assert LabelHistogram.from_dict(h.to_dict()) == h
    with pytest.raises(ValueError, match="not among the classes"):
        unit_contributions(["a", "z"], CLASSES)
    with pytest.raises(ValueError, match="noise_multiplier"):
        release_label_histogram(["a"], CLASSES, 0.0)
