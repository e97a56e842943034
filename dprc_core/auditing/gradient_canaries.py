"""One-run audit of a DP-SGD engine with Dirac gradient canaries (white-box gradient model).

Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846), §6's white-box setting: the auditor may
insert *gradient* canaries. Here the model is a linear functional f_w(x) = ⟨w, x⟩ whose
per-sample loss is f_w(x) itself, so the gradient of an example is exactly its input x. The
data set holds

* ``real_examples`` ordinary examples: Gaussian vectors on the first ``real_dim`` coordinates;
* m canaries: canary i is the Dirac vector ``canary_scale · C · e_{real_dim + i}`` (a norm far
  above the clipping norm C, so that every clipping rule clips it: exact clipping to exactly C,
  randomized clipping to C·‖g‖/n̂, which may exceed C — the case the accountant charges for).
  Canary i is in the data set iff its coin S_i = +1 (probability 1/2, fixed seed).

One training run: every logical batch is a Poisson sample at rate q of the **whole** data set
(real examples and included canaries alike), split into micro-batches, passed through the
engine (``accumulate`` / ``step``), SGD with learning rate 1. The auditor observes the released
iterates w_0 … w_T; since the gradients do not depend on w, the update of step t,
u_t = (w_{t−1} − w_t) · B_0 = (Σ clipped gradients + noise) · B_0 / B, is a post-processing of
the iterates, and its coordinate real_dim + i carries canary i's contribution. B = q·n is the
engine's expected batch size (n counts the included canaries); the auditor rescales by
B_0 = q·(real_examples + m/2), which it knows without the coins — the guesses must depend on
the output alone, not on how many canaries were included.

Scores (higher = looks included), both post-processings of the released iterates:

* ``"likelihood_ratio"`` (default): Σ_t log(1 − q + q · exp((u_ti·C − C²/2) / (σC)²)), the
  log-likelihood ratio of "canary contributes C when sampled" against "never", with the
  *claimed* σ — the optimal test against an exact-clipping mechanism that behaves as claimed;
* ``"sum"``: Σ_t u_ti, what the final model alone reveals (w_0 − w_T).

The privacy unit is one example (add/remove), so the engine's (ε, δ) applies to each canary;
the bound of :mod:`dprc_core.auditing.bounds` turns the guesses into an ε lower bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from dprc_core.auditing.bounds import AuditResult, audit_scores
from dprc_core.training.sampling import poisson_indices


class AuditedEngine(Protocol):
    """What the audit needs of an engine: :class:`dprc_core.PrivacyEngine` has it."""

    def accumulate(
        self, loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor], batch: torch.Tensor, /
    ) -> object: ...

    def step(self) -> object: ...


EngineFactory = Callable[[nn.Module, torch.optim.Optimizer, float, int], AuditedEngine]
SCORES = ("likelihood_ratio", "sum")


def linear_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Per-sample loss ⟨w, x_i⟩: its gradient with respect to w is x_i."""
    return model(batch).squeeze(-1)


def zero_linear_model(
    d_in: int, d_out: int, dtype: torch.dtype
) -> tuple[nn.Linear, torch.optim.Optimizer]:
    """The audited model: a bias-free linear map from w = 0, and SGD with learning rate 1 (so
    an update is exactly the engine's noised, clipped and divided gradient)."""
    model = nn.Linear(d_in, d_out, bias=False).to(dtype)
    with torch.no_grad():
        model.weight.zero_()
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def scores_from_updates(
    updates: np.ndarray,
    score: str,
    sample_rate: float,
    noise_multiplier: float,
    max_grad_norm: float,
) -> np.ndarray:
    """Per-canary scores from the (steps, m) canary coordinates of the released updates."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if score == "sum":
        return updates.sum(0)
    c = float(max_grad_norm)
    var = (noise_multiplier * c) ** 2
    if not var > 0:
        raise ValueError("the likelihood-ratio score needs a claimed noise_multiplier > 0")
    llr = (updates * c - c * c / 2) / var
    q = sample_rate
    # log(1 - q + q e^llr), stably
    return np.logaddexp(math.log1p(-q) if q < 1 else -np.inf, math.log(q) + llr).sum(0)


@dataclass
class CanaryRun:
    result: AuditResult
    scores: np.ndarray  # (m,)
    included: np.ndarray  # (m,) bool
    updates: np.ndarray  # (steps, m) canary coordinates of u_t (units: gradient · B_0 / B)
    sample_rate: float
    steps: int
    expected_batch_size: float  # B, what the engine divides by
    scale: float  # B_0, what the auditor multiplies by


def run_gradient_canary_audit(
    engine_factory: EngineFactory,
    *,
    canaries: int,
    sample_rate: float,
    steps: int,
    noise_multiplier: float,
    delta: float,
    real_examples: int = 500,
    real_dim: int = 8,
    max_grad_norm: float = 1.0,
    canary_scale: float = 100.0,
    micro_batch_size: int = 64,
    seed: int = 0,
    score: str = "likelihood_ratio",
    confidence: float = 0.95,
    guess_counts: list[int] | None = None,
    dtype: torch.dtype = torch.float64,
) -> CanaryRun:
    """Run one training with ``canaries`` Dirac canaries and audit it.

    ``engine_factory(model, optimizer, expected_batch_size, seed)`` returns the engine under
    audit (a :class:`dprc_core.PrivacyEngine`, or anything with ``accumulate`` / ``step``)
    built with the clipping norm ``max_grad_norm``; ``noise_multiplier`` is the σ it *claims*
    (used by the likelihood-ratio score only). Returns the scores, the coins and the
    :class:`~dprc_core.auditing.bounds.AuditResult` at ``delta`` and ``confidence``.
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if score == "likelihood_ratio" and not noise_multiplier > 0:
        raise ValueError("the likelihood-ratio score needs a claimed noise_multiplier > 0")
    if canaries < 2 or steps < 1 or not 0 < sample_rate <= 1:
        raise ValueError("need canaries >= 2, steps >= 1 and 0 < sample_rate <= 1")
    rng = np.random.default_rng(seed)
    included = rng.random(canaries) < 0.5
    dim = real_dim + canaries
    c = float(max_grad_norm)
    real = torch.zeros(real_examples, dim, dtype=dtype)
    real[:, :real_dim] = torch.from_numpy(rng.normal(size=(real_examples, real_dim))).to(dtype)
    idx = np.flatnonzero(included)
    canary_rows = torch.zeros(len(idx), dim, dtype=dtype)
    canary_rows[torch.arange(len(idx)), torch.from_numpy(real_dim + idx)] = canary_scale * c
    data = torch.cat([real, canary_rows])
    n = data.shape[0]
    expected = sample_rate * n
    scale = sample_rate * (real_examples + canaries / 2)  # known without the coins

    model, opt = zero_linear_model(dim, 1, dtype)
    engine = engine_factory(model, opt, expected, seed)
    sampler = torch.Generator().manual_seed(seed + 1)
    updates = np.zeros((steps, canaries))
    prev = model.weight.detach()[0, real_dim:].clone()
    for t in range(steps):
        chosen = poisson_indices(n, sample_rate, sampler)  # the trainer's own coins
        for part in chosen.split(micro_batch_size):
            engine.accumulate(linear_loss, data[part])
        engine.step()
        now = model.weight.detach()[0, real_dim:].clone()
        updates[t] = ((prev - now) * scale).numpy()
        prev = now
    scores = scores_from_updates(updates, score, sample_rate, noise_multiplier, c)
    result = audit_scores(scores, included, delta, confidence, guess_counts)
    return CanaryRun(result, scores, included, updates, sample_rate, steps, expected, scale)
