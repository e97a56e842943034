"""The label distribution of a classification data set, released under DP as a noised histogram.

A synthetic classification data set needs labels to condition the generator on. The labels'
frequencies come from the private data, so they are released by the Gaussian mechanism and
charged like any other release (docs/synthetic.md, "What the labels cost"):

* **Contribution.** Each privacy unit adds a vector over the classes of L2 norm at most 1: an
  example its label's one-hot vector; a user (``users`` given) the fractions of its examples in
  each class (L1 norm 1, so L2 norm ≤ 1), however many examples it has. Adding or removing one
  unit moves the histogram by at most 1 in L2: the sensitivity is 1.
* **Noise.** N(0, σ²) on every class count, once. The release is the Gaussian mechanism with
  noise multiplier σ — accounted as one Poisson-subsampled Gaussian step at sampling rate 1
  (:func:`histogram_event`), which the accountant composes with the fine-tuning's steps.
* **Post-processing.** The distribution used to draw labels clips the noised counts at 0 and
  normalises them (uniform if none is positive); that reads the release only.
* **Class names are treated as public.** The histogram is over ``classes``, given by the caller;
  the names themselves are not protected by the noise (as for a classification job, whose model
  names its labels). A caller for whom the names are private gives a list that holds every name
  that could occur.

The noise comes from the OS-keyed ChaCha20 stream (:mod:`dprc_core.noise.secure_stream`) unless
a ``seed`` is given (tests and benchmarks: whoever knows the seed knows the noise).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dprc_core.accounting.calibration import noise_multiplier as calibrated_sigma
from dprc_core.accounting.event_checks import check_noise_multiplier
from dprc_core.accounting.events import SubsampledGaussianEvent
from dprc_core.seeding import derive_seed


def histogram_event(noise_multiplier: float) -> SubsampledGaussianEvent:
    """The release's privacy event: one Gaussian mechanism of sensitivity 1 and noise
    multiplier σ, i.e. one subsampled-Gaussian step at sampling rate 1 with exact norms."""
    return SubsampledGaussianEvent(noise_multiplier, 1.0, 1)


def histogram_sigma(epsilon: float, delta: float) -> float:
    """The smallest noise multiplier (within 0.5 %) whose histogram release alone is
    (ε, δ)-DP by the accountant."""
    return calibrated_sigma(epsilon, delta, 1.0, 1)


@dataclass(frozen=True)
class LabelHistogram:
    """A released histogram: the classes (public), their noised counts and σ."""

    classes: tuple[str, ...]
    noisy_counts: tuple[float, ...]
    noise_multiplier: float

    def __post_init__(self) -> None:
        if len(self.classes) != len(self.noisy_counts) or not self.classes:
            raise ValueError("a label histogram needs one noised count per class, and a class")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("the classes of a label histogram must be distinct")

    def distribution(self) -> tuple[float, ...]:
        """The probabilities labels are drawn with: the counts clipped at 0 and normalised
        (uniform when no count is positive). Post-processing of the release."""
        kept = [max(0.0, c) if math.isfinite(c) else 0.0 for c in self.noisy_counts]
        total = sum(kept)
        if total <= 0:
            return tuple(1.0 / len(kept) for _ in kept)
        return tuple(c / total for c in kept)

    @property
    def event(self) -> SubsampledGaussianEvent:
        return histogram_event(self.noise_multiplier)

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "noisy_counts": list(self.noisy_counts),
            "noise_multiplier": self.noise_multiplier,
            "distribution": list(self.distribution()),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabelHistogram:
        return cls(
            tuple(str(c) for c in data["classes"]),
            tuple(float(c) for c in data["noisy_counts"]),
            float(data["noise_multiplier"]),
        )


def unit_contributions(
    labels: Sequence[Any], classes: Sequence[str], users: Sequence[Any] | None = None
) -> torch.Tensor:
    """The histogram before noise, float64 [classes]: the sum over privacy units of each unit's
    contribution (an example's one-hot vector; a user's class fractions)."""
    index = {c: j for j, c in enumerate(classes)}
    unknown = sorted({str(label) for label in labels} - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} are not among the classes {list(classes)[:20]}")
    total = torch.zeros(len(classes), dtype=torch.float64)
    if users is None:
        for label, count in Counter(str(label) for label in labels).items():
            total[index[label]] += count
        return total
    if len(users) != len(labels):
        raise ValueError("one user per label")
    per_user: dict[Any, Counter[str]] = defaultdict(Counter)
    for label, user in zip(labels, users, strict=True):
        per_user[user][str(label)] += 1
    for counts in per_user.values():
        n = sum(counts.values())
        for label, count in counts.items():
            total[index[label]] += count / n
    return total


def release_label_histogram(
    labels: Sequence[Any],
    classes: Sequence[str],
    noise_multiplier: float,
    *,
    users: Sequence[Any] | None = None,
    seed: int | None = None,
) -> LabelHistogram:
    """Release the label histogram of ``labels`` over ``classes`` with Gaussian noise of std
    ``noise_multiplier`` (the sensitivity is 1, see the module's docstring); with ``users``, a
    user is the unit. ``seed``: a torch generator's seed for the noise (tests); None: the
    secure stream."""
    sigma = check_noise_multiplier(noise_multiplier)
    classes = [str(c) for c in classes]
    counts = unit_contributions(labels, classes, users)
    if seed is None:
        from dprc_core.noise.secure_gaussian import SecureGaussianNoise

        noise = SecureGaussianNoise(sigma).generate(0, 0, counts.shape, torch.float64)
    else:
        generator = torch.Generator().manual_seed(derive_seed(seed, "label-histogram"))
        noise = sigma * torch.randn(counts.shape, generator=generator, dtype=torch.float64)
    return LabelHistogram(tuple(classes), tuple((counts + noise).tolist()), sigma)
