"""The step-trial audit in the pair layout of DP DPO (dprc_core/preference.py, issue 43).

A preference pair (the chosen and the rejected answer to one prompt) is one privacy unit. In the
pair layout a batch is (P, 2, d) and the loss returns (P,), so the engine clips each pair's
whole gradient once: a canary pair (two rows, each the canary's Dirac gradient) moves the
update by C. An engine that clips each sequence apart lets it move the update by 2·C.

* σ = 0: a canary pair scores exactly 1 (C) in the pair layout, 2 when its rows are clipped
  apart;
* dprc's engine in the pair layout (exact clipping; per-example Hutchinson sketches keyed by
  the pair; and the row layout with ``user_ids`` = the pair, as dprc_core.preference's "rows"
  layout) stays below the ε that one unsubsampled Gaussian step at σ claims;
* dprc's own engine given the same rows in the row layout, one sample per sequence, is refuted
  at 95 % confidence.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dprc_core import Clipping, Gaussian, PrivacyEngine, accounting
from dprc_core.auditing.step_trials import pair_bilinear_loss, run_step_trial_audit
from dprc_core.clipping import norm_from_method

DELTA = 1e-5


def _claim(norm_method: str, sketch: str, eps: float) -> tuple[float, float]:
    """σ for ε at δ, one step at q = 1, and the ε the accountant gives it (the claim)."""
    k = None if norm_method == "exact" else 32
    sigma = accounting.noise_multiplier(eps, DELTA, 1.0, 1, norm_method, k, sketch=sketch)
    return sigma, accounting.epsilon(sigma, 1.0, 1, DELTA, envelope=norm_method, k=k, sketch=sketch)


def _engine(sigma: float, norm_method: str = "exact", sketch: str = "shared", layout="pairs"):
    """dprc's engine, given each micro-batch of (P, 2, d) pairs in one of three layouts:

    * ``pairs``: as it comes, one sample per pair (the pair layout of dprc_core.preference);
    * ``rows_by_pair``: as (2P, 1, d) rows with ``user_ids`` = each row's pair (the "rows"
      layout of dprc_core.preference: each pair's two rows one unit);
    * ``per_sequence``: BROKEN on purpose (test only) — as (2P, 1, d) rows, one sample per
      sequence, while claiming DP per pair: each sequence of a pair is clipped apart."""

    class Engine(PrivacyEngine):
        next_pair = 0  # rows_by_pair: user ids distinct across the logical batch

        def accumulate(self, loss_fn, batch, example_ids=None, user_ids=None):
            if layout == "pairs":
                return super().accumulate(loss_fn, batch, example_ids, user_ids)
            rows = batch.reshape(-1, 1, batch.shape[-1])
            if layout == "rows_by_pair":
                n = batch.shape[0]
                pairs = self.next_pair + torch.arange(n).repeat_interleave(2)
                self.next_pair += n
                return super().accumulate(loss_fn, rows, user_ids=pairs)
            assert layout == "per_sequence"
            ids = None
            if example_ids is not None:  # each sequence keyed on its own
                ids = [2 * int(i) + k for i in example_ids for k in (0, 1)]
            return super().accumulate(loss_fn, rows, ids)

    def make(model, opt, expected_batch_size, seed):
        return Engine(
            model,
            opt,
            clipping=Clipping(1.0, norm_from_method(norm_method, k=32, sketch=sketch)),
            noise=Gaussian(sigma),
            expected_batch_size=expected_batch_size,
            seed=seed,
        )

    return make


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
@pytest.mark.parametrize(
    ("layout", "want"), [("pairs", 1.0), ("rows_by_pair", 1.0), ("per_sequence", 2.0)]
)
def test_a_canary_pair_adds_c_once_and_twice_when_its_sequences_are_clipped_apart(layout, want):
    """σ = 0, exact clipping, micro-batches of 5 pairs: an included canary pair scores exactly
    1 (C) when the pair is the sample, 2 when each sequence is; an excluded one exactly 0."""
    audit = run_step_trial_audit(
        _engine(0.0, layout=layout),
        side=4,
        repetitions=3,
        noise_multiplier=1.0,
        delta=DELTA,
        micro_batch_size=5,
        by_pair=True,
    )
    np.testing.assert_allclose(audit.scores, want * audit.included, atol=1e-12)


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_per_example_sketches_are_keyed_by_the_pair():
    """σ = 0, per-example hutch: an excluded canary pair's coordinate is exactly 0, an included
    one a random scale a of C (not 1, not 2: the pair's sketched norm)."""
    audit = run_step_trial_audit(
        _engine(0.0, "hutch", "per_example"),
        side=4,
        repetitions=3,
        noise_multiplier=1.0,
        delta=DELTA,
        micro_batch_size=5,
        by_pair=True,
    )
    assert np.all(audit.scores[~audit.included] == 0.0)
    scales = audit.scores[audit.included]
    assert np.all((scales > 0.3) & (scales < 3.0)) and np.ptp(scales) > 0.01


@pytest.mark.parametrize(
    ("norm_method", "sketch", "layout", "side", "reps"),
    [
        ("exact", "shared", "pairs", 32, 200),
        ("hutch", "per_example", "pairs", 24, 40),
        ("exact", "shared", "rows_by_pair", 24, 100),
    ],
)
def test_the_pair_layout_stays_below_its_claimed_epsilon(norm_method, sketch, layout, side, reps):
    """σ claimed for ε = 1 per pair, one step at q = 1: dprc's engine clips each pair once and
    its bound stays below the claim (≈ 0.5–0.6 exact, 2·10⁵ trials; ≈ 0.3–0.4 hutch)."""
    sigma, claimed = _claim(norm_method, sketch, 1.0)
    audit = run_step_trial_audit(
        _engine(sigma, norm_method, sketch, layout),
        side=side,
        repetitions=reps,
        noise_multiplier=sigma,
        delta=DELTA,
        seed=11,
        by_pair=True,
    )
    assert audit.bound.epsilon_lower <= claimed, (
        f"PRIVACY BUG? audited lower bound {audit.bound} above the claimed {claimed:.3f}"
    )


def test_clipping_each_sequence_apart_is_refuted():
    """The same rows, one sample per sequence: a canary pair moves the update by 2·C, the
    step's true ε at the σ claimed for ε = 1 is ≈ 2.15, and 48²·200 ≈ 4.6·10⁵ trials put the
    bound above 1 (≈ 1.4–1.6 over seeds) at 95 % confidence."""
    sigma, claimed = _claim("exact", "shared", 1.0)
    audit = run_step_trial_audit(
        _engine(sigma, layout="per_sequence"),
        side=48,
        repetitions=200,
        noise_multiplier=sigma,
        delta=DELTA,
        seed=12,
        by_pair=True,
    )
    assert audit.bound.confidence == 0.95
    assert audit.bound.epsilon_lower > claimed, audit.bound


def test_pair_bilinear_loss_sums_the_pair_rows_gradients():
    model = torch.nn.Linear(3, 2, bias=False).double()
    x = torch.randn(1, 2, 3, dtype=torch.float64)
    y = torch.randn(1, 2, 2, dtype=torch.float64)
    losses = pair_bilinear_loss(model, torch.cat([x, y], -1))
    assert losses.shape == (1,)
    losses.sum().backward()
    torch.testing.assert_close(
        model.weight.grad, y[0, 0, :, None] * x[0, 0] + y[0, 1, :, None] * x[0, 1]
    )


def test_pairs_and_users_are_not_combined():
    with pytest.raises(ValueError, match="by_pair and by_user"):
        run_step_trial_audit(
            _engine(3.0),
            side=4,
            repetitions=1,
            noise_multiplier=3.0,
            delta=DELTA,
            by_pair=True,
            by_user=True,
        )
