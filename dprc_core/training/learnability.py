"""Whether a DP training plan can learn: one criterion, shared by DPTrainer and ``dprc train``.

DP-SGD adds Gaussian noise of standard deviation σ·C to the sum of a step's clipped
per-example gradients and divides by the expected batch size B, so every coordinate of the
averaged update carries noise of standard deviation σ·C/B, while the signal (the mean of
per-example gradients clipped to norm C) has norm at most C, so each of its coordinates at
most C. The **noise ratio**

    σ/B        (the noise per coordinate of each averaged update, in units of C)

is what one step sees (Sander et al., "TAN without a burn", ICML 2023: at a fixed number of
steps, accuracy depends on σ/B). An adaptive optimizer (Adam, AdamW, Lion) divides each
coordinate by its running magnitude, which the noise dominates, so a step moves a weight by
about the learning rate lr in a mostly random direction and, in expectation, by at most
lr·(|g_i|/C)·B/σ towards the signal. Over the T steps of the plan the signal moves any weight
by at most

    reach = lr · T · B / σ     (in units of the weights, times |g_i|/C <= 1)

and a plan whose reach is small cannot move the weights far enough from where they started.
A plan is flagged when

* an adaptive optimizer's ``reach < MIN_REACH`` (1.0), or
* it runs fewer than ``MIN_STEPS`` (10) optimizer steps, whatever the optimizer.

The thresholds are calibrated on measurements (docs/benchmarks/recipes.md, made by
``benchmarks/recipes.py``, MiniLM-L6 on 800 reviews at ε = 8): the Trainer's defaults (lr 5e-5,
expected batch 8, 3 epochs: 300 steps at σ = 0.45–0.49, reach 0.25–0.27) stay at chance
accuracy for the linear probe and for LoRA, while every plan that learned has a reach of 6 or
more — LoRA at the same batch 8 and σ/B = 0.056 with lr 5e-3 (reach 27) reaches 0.995, so the
batch alone does not decide it; one epoch of full fine-tuning at batch 128 (7 steps, reach
1.7) stays at chance, hence the floor on steps. Plain SGD is judged by its steps only: its step
is lr times the noised gradient, not normalised per coordinate. σ = 0 (not private) and
ν-DP-FTRL (correlated noise) are not judged. It is a warning, not a refusal: the criterion is
a bound and a calibration, not a proof, and a plan just above it may still learn little.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dprc_core.training.plan import PrivacyPlan

MIN_REACH = 1.0  # lr·T·B/σ below this is flagged (adaptive optimizers)
MIN_STEPS = 10  # fewer optimizer steps than this are flagged
# the recipes of docs/training.md ("Recipes"): what a warning suggests
RECIPE_LEARNING_RATES = "Adam lr 0.1 for a linear probe, 5e-3 for LoRA, 1e-3 for full fine-tuning"


class LearnabilityWarning(UserWarning):
    """A DP training plan that is unlikely to learn (:func:`assess`): it runs, but check it."""


@dataclass(frozen=True)
class Learnability:
    """The criterion's verdict on one plan (see the module's docstring)."""

    noise_multiplier: float  # σ
    expected_batch_size: float  # B
    steps: int  # T
    learning_rate: float | None  # the peak learning rate
    noise_ratio: float  # σ/B: noise std per coordinate of each averaged update, in units of C
    reach: float | None  # lr·T·B/σ (adaptive optimizers with σ > 0), else None
    reasons: tuple[str, ...]  # empty: nothing flagged
    min_reach: float = MIN_REACH  # the thresholds it was judged by
    min_steps: int = MIN_STEPS

    @property
    def ok(self) -> bool:
        return not self.reasons

    def message(self, batch_setting: str = "the expected batch size") -> str:
        """One warning text naming the numbers and what to change; ``batch_setting`` names the
        setting that sets B where the plan comes from (DPTrainer: its two arguments)."""
        if self.ok:
            return ""
        fixes = []
        if self.reach is not None and self.reach < self.min_reach:
            assert self.learning_rate is not None
            needed = self.learning_rate * self.min_reach / self.reach
            fixes.append(
                f"raise the learning rate to well above {needed:.2g} (the recipes: "
                f"{RECIPE_LEARNING_RATES}, constant) or train for more epochs (the reach grows "
                "with the steps; at a fixed number of epochs a larger batch does not raise it, "
                "since σ grows with B)"
            )
        if self.steps < self.min_steps:
            fixes.append(
                f"train for more epochs or use a smaller {batch_setting} (more steps per epoch)"
            )
        return (
            "this DP training plan is unlikely to learn: "
            + "; ".join(self.reasons)
            + ". To learn: "
            + "; ".join(fixes)
            + ' (docs/training.md, "Recipes")'
        )


def assess(
    noise_multiplier: float,
    expected_batch_size: float,
    steps: int,
    learning_rate: float | None = None,
    *,
    adaptive: bool = True,
    min_reach: float = MIN_REACH,
    min_steps: int = MIN_STEPS,
) -> Learnability:
    """The verdict on a plan of ``steps`` steps at noise multiplier σ, expected batch size B and
    peak learning rate ``learning_rate`` (None: the reach is not judged). ``adaptive``: the
    optimizer normalises each coordinate (Adam, AdamW, Lion); plain SGD is judged by its steps
    only. σ = 0 (no noise) has no reach."""
    if not expected_batch_size > 0:
        raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier!r}")
    sigma, b = float(noise_multiplier), float(expected_batch_size)
    ratio = sigma / b
    reach = None
    if adaptive and learning_rate is not None and sigma > 0:
        reach = learning_rate * steps / ratio
    reasons = []
    if reach is not None and reach < min_reach:
        reasons.append(
            f"learning rate {learning_rate:.3g} over {steps} steps at expected batch {b:g} "
            f"with noise multiplier σ = {sigma:.3g}: each averaged update carries noise of "
            f"standard deviation σ/B = {ratio:.3g}·C per coordinate, so an adaptive "
            "optimizer's step follows the clipped gradient (norm at most C) by at most "
            f"lr·B/σ per step, and the whole run reaches lr·T·B/σ = {reach:.3g} "
            f"(below {min_reach:g})"
        )
    if steps < min_steps:
        reasons.append(f"{steps} optimizer steps (fewer than {min_steps})")
    return Learnability(
        sigma, b, int(steps), learning_rate, ratio, reach, tuple(reasons), min_reach, min_steps
    )


def is_adaptive(optimizer_name: str) -> bool:
    """Whether an optimizer (a class name, or a ``TrainingArguments.optim`` value) normalises
    each coordinate: Adam and its variants, Lion."""
    name = optimizer_name.lower()
    return "adam" in name or "lion" in name


def warn_if_unlearnable(
    plan: PrivacyPlan,
    learning_rate: float | None,
    *,
    adaptive: bool = True,
    batch_setting: str = "the expected batch size",
    stacklevel: int = 2,
) -> Learnability | None:
    """Emit one :class:`LearnabilityWarning` when ``plan`` (trained at peak ``learning_rate``)
    is flagged by :func:`assess`; the verdict, or None for a plan the criterion does not judge:
    σ = 0 (not private) and ν-DP-FTRL (its correlated noise is not an independent σ·C/B per
    step). ``stacklevel`` as for :func:`warnings.warn` called where this is called."""
    if not plan.noise.independent_noise or plan.noise_multiplier == 0:
        return None
    verdict = assess(
        plan.noise_multiplier, plan.batch_size, plan.steps, learning_rate, adaptive=adaptive
    )
    if not verdict.ok:
        warnings.warn(
            verdict.message(batch_setting), LearnabilityWarning, stacklevel=stacklevel + 1
        )
    return verdict
