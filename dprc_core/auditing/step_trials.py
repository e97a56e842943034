"""A many-trial audit of one engine step (white-box gradient model, no subsampling).

The one-run audit (:mod:`gradient_canaries`) spends its power on composition and Poisson
sampling; what sets per-example sketches apart is the step itself, the random and hidden scale
of a clipped contribution. This audit looks at that step alone, with enough independent trials
to resolve a factor 2 in the noise.

Setting. The model is one linear map ``W`` of shape ``(s + real_rows, s)`` and an example is a
pair ``(x, y)`` with per-sample loss ``yᵀ W x``, so its gradient is exactly ``y xᵀ``. Canary
``(r, c)`` (``r, c < s``) is the rank-1 Dirac gradient ``canary_scale · C · e_r e_cᵀ``, a norm far
above C, so that every clipping rule clips it: to exactly C·e_r e_cᵀ (exact clipping) or to
``a·C·e_r e_cᵀ`` with a random scale ``a = ‖g‖/n̂`` (randomized clipping). Real examples have
random rank-1 gradients on the extra ``real_rows`` rows only. Every repetition is one
``accumulate``/``step`` of the engine (SGD, learning rate 1) on a fresh data set: each of the
s² canaries is in with a fresh fair coin, and every example present is in the logical batch
(sample rate 1), split into micro-batches.

Trials. Coordinate ``(r, c)`` of repetition ``t``'s update, rescaled by the expected batch size
the engine divides by and by 1/C, is ``a·[canary in] + σ·z``: the noise is i.i.d. per
coordinate and per step, nothing else touches that coordinate, and — with exact clipping or
per-example sketches, whose projections are drawn afresh per example, parameter and step — the
scales are independent across canaries and steps. So the s²·repetitions (coin, score) pairs are
independent trials of one (ε, δ)-DP step, each a post-processing of what the step released.
(With **shared** sketches the canaries of one step share a projection and their scales are
dependent: the counts below would not be binomial, and this audit refuses that case.)

User-level DP (``by_user=True``): every example is a user of its own, except the canaries,
each a user of ``canary_lines`` identical lines, and the engine is given ``user_ids`` (each
user's lines in one micro-batch). An engine that clips each user's summed gradient adds at most
C to a canary coordinate, as for one line; one that clips each line adds up to
``canary_lines``·C and is refuted.

Preference pairs (``by_pair=True``, DP DPO: :mod:`dprc_core.preference`): every example is a
pair of two rows, the privacy unit, given in the *pair layout* — (P, 2, d) batches, a loss
(:func:`pair_bilinear_loss`) that runs the pairs' rows as (2P, d), as
:mod:`dprc_core.preference` runs a pair's chosen and rejected sequences, and returns the (P,)
sums of each pair's two rows' losses — with ``example_ids`` per pair where the engine keys
per-example sketches (``accounting_sketch == "per_example"``). A real pair is two rows with
random rank-1 gradients; a canary pair is two rows that each carry the canary's Dirac
gradient, so the pair's gradient is twice a row's. An engine that clips each pair's gradient
adds at most C to a canary coordinate; one that clips each sequence (row) of a pair apart adds
up to 2·C — twice the sensitivity it claims — and is refuted.

The bound. If the step is (ε, δ)-DP for adding or removing one example, every test satisfies
``P(reject | in) ≤ e^ε P(reject | out) + δ`` and the same with in and out swapped. For each
threshold τ of a grid fixed in advance (multiples of the *claimed* σ) and both half-lines
(score > τ: "in"; score < τ: "out") the counts are binomial; a Clopper–Pearson lower bound on
the one rate and upper bound on the other give ``ε ≥ log((p_lo − δ)/p_hi)`` at that level. The
grid and the two directions are a multiple test: each is made at level (1 − confidence)/(2·
|grid|) (Bonferroni), so the maximum over them is a lower bound at ``confidence``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import torch
from scipy import stats
from torch import nn

from dprc_core.auditing.gradient_canaries import EngineFactory, zero_linear_model
from dprc_core.training.user_sampling import user_micro_batches

THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)  # τ / σ_claimed, fixed in advance


def bilinear_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Per-sample loss ``yᵀ W x`` for rows ``[x | y]``: its gradient with respect to W is y xᵀ."""
    d_in = model.in_features
    x, y = batch[:, :d_in], batch[:, d_in:]
    return (model(x) * y).sum(-1)


def pair_bilinear_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """(P,) per-pair losses of a (P, 2, d) batch of pairs: the pairs' rows run as (2P, d) rows
    (pair-major, as :mod:`dprc_core.preference` runs a pair's two sequences) and each pair's
    two bilinear losses summed, so a pair's gradient is the sum of its rows' ``y xᵀ``. A
    (N, 1, d) batch — each row a "pair" of its own — gives the (N,) row losses."""
    if batch.dim() != 3:
        raise ValueError(f"pairs are (P, 2, d) tensors, got {tuple(batch.shape)}")
    rows = bilinear_loss(model, batch.reshape(-1, batch.shape[-1]))
    return rows.reshape(batch.shape[0], batch.shape[1]).sum(1)


@dataclass(frozen=True)
class TrialBound:
    epsilon_lower: float  # ε lower bound at `confidence` (0 when nothing is refuted)
    threshold: float  # τ of the best test, in units of C
    direction: str  # "above" (score > τ says in) or "below" (score < τ says out)
    positives: tuple[int, int]  # (hits among "in" trials, hits among "out" trials)
    trials: tuple[int, int]  # ("in" trials, "out" trials)
    confidence: float
    delta: float


def trial_lower_bound(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    thresholds: Sequence[float],
    confidence: float = 0.95,
) -> TrialBound:
    """The ε lower bound from independent (score, coin) trials of one mechanism: for each
    threshold and both half-lines, Clopper–Pearson at level (1 − confidence)/(2·len), Bonferroni
    over them. ``thresholds`` must be chosen before looking at the scores."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included, dtype=bool).reshape(-1)
    if s.shape != inc.shape or not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite and of the same shape as included")
    n_in, n_out = int(inc.sum()), int((~inc).sum())
    if n_in == 0 or n_out == 0 or not thresholds:
        raise ValueError("need trials of both kinds and at least one threshold")
    if not 0 <= delta < 1 or not 0 < confidence < 1:
        raise ValueError("need 0 <= delta < 1 and 0 < confidence < 1")
    alpha = (1.0 - confidence) / (2 * len(thresholds))
    s_in, s_out = s[inc], s[~inc]
    best = TrialBound(0.0, float(thresholds[0]), "above", (0, 0), (n_in, n_out), confidence, delta)
    for tau in thresholds:
        # above: P(s > τ | in) ≤ e^ε P(s > τ | out) + δ
        # below: P(s < τ | out) ≤ e^ε P(s < τ | in) + δ
        for direction, (k_hi, n_hi), (k_lo, n_lo) in (
            ("above", (int((s_in > tau).sum()), n_in), (int((s_out > tau).sum()), n_out)),
            ("below", (int((s_out < tau).sum()), n_out), (int((s_in < tau).sum()), n_in)),
        ):
            p_lo = _cp_lower(k_hi, n_hi, alpha)
            p_hi = _cp_upper(k_lo, n_lo, alpha)
            if p_lo <= delta or p_hi <= 0:
                continue
            eps = math.log((p_lo - delta) / p_hi)
            if eps > best.epsilon_lower:
                best = TrialBound(
                    eps, float(tau), direction, (k_hi, k_lo), (n_hi, n_lo), confidence, delta
                )
    return best


def _cp_lower(k: int, n: int, alpha: float) -> float:
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def _cp_upper(k: int, n: int, alpha: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


@dataclass
class StepTrialAudit:
    bound: TrialBound
    scores: np.ndarray  # (repetitions, s²): the canary coordinates of each update, units of C
    included: np.ndarray  # (repetitions, s²) bool
    expected_batch_size: float


def run_step_trial_audit(
    engine_factory: EngineFactory,
    *,
    side: int,
    repetitions: int,
    noise_multiplier: float,
    delta: float,
    real_examples: int = 16,
    real_rows: int = 4,
    max_grad_norm: float = 1.0,
    canary_scale: float = 100.0,
    micro_batch_size: int = 512,
    seed: int = 0,
    confidence: float = 0.95,
    thresholds: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float64,
    by_user: bool = False,
    canary_lines: int = 1,
    by_pair: bool = False,
) -> StepTrialAudit:
    """``repetitions`` single steps of the engine, each with side² Dirac canaries in on fresh
    coins; the trial bound of those side²·repetitions trials.

    ``engine_factory(model, optimizer, expected_batch_size, seed)`` builds the engine under audit
    with clipping norm ``max_grad_norm`` and sample rate 1 (every example given to a step is in
    its batch); ``noise_multiplier`` is the σ it *claims*, which only places the thresholds
    (``thresholds`` in units of σ·C; default :data:`THRESHOLDS`). The engine must clip every
    example with its own randomness (exact clipping or per-example sketches): see the module
    docstring. ``by_user``: canary users of ``canary_lines`` lines; ``by_pair``: every
    example a preference pair of two rows in the pair layout (micro-batches of
    ``micro_batch_size`` pairs), one privacy unit (module docstring)."""
    if side < 2 or repetitions < 1 or real_rows < 1 or real_examples < 0:
        raise ValueError("need side >= 2, repetitions >= 1, real_rows >= 1, real_examples >= 0")
    if canary_lines < 1 or (canary_lines > 1 and not by_user):
        raise ValueError("canary_lines > 1 needs by_user=True (a canary user of several lines)")
    if by_pair and by_user:
        raise ValueError("by_pair and by_user are two privacy units (pair, user): choose one")
    if not noise_multiplier > 0:
        raise ValueError("the thresholds are placed at multiples of the claimed σ: need σ > 0")
    rng = np.random.default_rng(seed)
    c = float(max_grad_norm)
    d_out = side + real_rows
    rows, cols = np.divmod(np.arange(side * side), side)
    canaries = torch.zeros(side * side, side + d_out, dtype=dtype)
    canaries[torch.arange(side * side), torch.from_numpy(cols)] = canary_scale * c
    canaries[torch.arange(side * side), torch.from_numpy(side + rows)] = 1.0
    n_real = real_examples * (2 if by_pair else 1)  # rows: a real pair is two
    real = torch.zeros(n_real, side + d_out, dtype=dtype)
    real[:, :side] = torch.from_numpy(rng.normal(size=(n_real, side))).to(dtype)
    real[:, 2 * side :] = torch.from_numpy(rng.normal(size=(n_real, real_rows))).to(dtype)
    if by_pair:  # (P, 2, d): a canary pair is two rows, each the canary's Dirac gradient
        real = real.reshape(real_examples, 2, -1)
        canaries = canaries[:, None].repeat(1, 2, 1)
    ids = torch.cat([side * side + torch.arange(real_examples), torch.arange(side * side)])
    expected = real_examples + side * side / 2  # what the engine divides by (known, fixed)

    model, opt = zero_linear_model(side, d_out, dtype)
    engine = engine_factory(model, opt, expected, seed)
    clipping = getattr(engine, "accounting_envelope", "exact")
    if clipping != "exact" and getattr(engine, "accounting_sketch", None) != "per_example":
        raise ValueError(
            "a shared sketch makes the canaries of one step share a projection: their trials "
            "are not independent and this audit's counts would not be binomial; audit exact "
            "clipping or per-example sketches (sketch='per_example')"
        )
    keyed = by_pair and getattr(engine, "accounting_sketch", None) == "per_example"
    included = rng.random((repetitions, side * side)) < 0.5
    scores = np.zeros((repetitions, side * side))
    prev = model.weight.detach()[:side].clone()
    for t in range(repetitions):
        if by_user:
            user_engine = cast(UserLevelEngine, engine)
            _user_step(
                user_engine, real, canaries, included[t], canary_lines, micro_batch_size, rng
            )
        else:
            inc = torch.from_numpy(np.flatnonzero(included[t]))
            batch = torch.cat([real, canaries[inc]])
            order = torch.from_numpy(rng.permutation(batch.shape[0]))
            batch, batch_ids = batch[order], torch.cat([ids[:real_examples], inc])[order]
            for part, part_ids in zip(
                batch.split(micro_batch_size), batch_ids.split(micro_batch_size), strict=True
            ):
                if not by_pair:
                    engine.accumulate(bilinear_loss, part)
                elif keyed:  # a pair's per-example projections keyed by the pair
                    pair_engine = cast(PairEngine, engine)
                    pair_engine.accumulate(pair_bilinear_loss, part, example_ids=part_ids)
                else:
                    engine.accumulate(pair_bilinear_loss, part)
            engine.step()
        now = model.weight.detach()[:side].clone()
        scores[t] = ((prev - now) * expected / c).reshape(-1).numpy()
        prev = now
    grid = [tau * noise_multiplier for tau in (thresholds or THRESHOLDS)]
    bound = trial_lower_bound(scores, included, delta, grid, confidence)
    return StepTrialAudit(bound, scores, included, expected)


class PairEngine(Protocol):
    """An engine that keys per-example sketches by ``example_ids``
    (:meth:`dprc_core.PrivacyEngine.accumulate`)."""

    def accumulate(
        self,
        loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
        batch: torch.Tensor,
        *,
        example_ids: torch.Tensor,
    ) -> object: ...

    def step(self) -> object: ...


class UserLevelEngine(Protocol):
    """An engine that takes each row's user (:meth:`dprc_core.PrivacyEngine.accumulate`)."""

    def accumulate(
        self,
        loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
        batch: torch.Tensor,
        *,
        user_ids: torch.Tensor,
    ) -> object: ...

    def step(self) -> object: ...


def _user_step(
    engine: UserLevelEngine,
    real: torch.Tensor,
    canaries: torch.Tensor,
    included: np.ndarray,
    canary_lines: int,
    micro_batch_size: int,
    rng: np.random.Generator,
) -> None:
    """One step of user-level DP: canary j (user j) with ``canary_lines`` copies of its line,
    each real example a user of its own; users in a random order, each user's lines together,
    micro-batches cut between users."""
    n_canaries = canaries.shape[0]
    inc = torch.from_numpy(np.flatnonzero(included))
    rows = torch.cat([real, canaries[inc].repeat_interleave(canary_lines, 0)])
    users = torch.cat(
        [n_canaries + torch.arange(real.shape[0]), inc.repeat_interleave(canary_lines)]
    )
    rank = torch.from_numpy(rng.permutation(n_canaries + real.shape[0]))
    order = torch.argsort(rank[users], stable=True)
    rows, users = rows[order], users[order]
    for part in user_micro_batches(torch.arange(rows.shape[0]), users, micro_batch_size):
        engine.accumulate(bilinear_loss, rows[part], user_ids=users[part])
    engine.step()
