"""Empirical privacy auditing: ε *lower* bounds from one training run with canaries.

* :mod:`~dprc_core.auditing.bounds` — the one-run bound of Steinke, Nasr & Jagielski (2023):
  :func:`p_value`, :func:`epsilon_lower_bound`, :func:`audit_scores`;
* :mod:`~dprc_core.auditing.gradient_canaries` — a white-box audit of a DP-SGD engine with
  Dirac gradient canaries: :func:`run_gradient_canary_audit`;
* :mod:`~dprc_core.auditing.step_trials` — a many-trial audit of one engine step (sample rate
  1, independent rank-1 Dirac canaries, Clopper–Pearson counts): :func:`run_step_trial_audit`,
  :func:`trial_lower_bound`.

An audit can refute a privacy claim (lower bound above the accounted ε) but never prove one;
see docs/auditing.md.
"""

from dprc_core.auditing.bounds import AuditResult, audit_scores, epsilon_lower_bound, p_value
from dprc_core.auditing.gradient_canaries import (
    CanaryRun,
    linear_loss,
    run_gradient_canary_audit,
    scores_from_updates,
)
from dprc_core.auditing.step_trials import (
    StepTrialAudit,
    TrialBound,
    run_step_trial_audit,
    trial_lower_bound,
)

__all__ = [
    "AuditResult",
    "CanaryRun",
    "StepTrialAudit",
    "TrialBound",
    "audit_scores",
    "epsilon_lower_bound",
    "linear_loss",
    "p_value",
    "run_gradient_canary_audit",
    "run_step_trial_audit",
    "scores_from_updates",
    "trial_lower_bound",
]
