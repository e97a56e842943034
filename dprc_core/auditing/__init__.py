"""Empirical privacy auditing: ε *lower* bounds from one training run with canaries.

* :mod:`~dprc_core.auditing.bounds` — the one-run bound of Steinke, Nasr & Jagielski (2023):
  :func:`p_value`, :func:`epsilon_lower_bound`, :func:`audit_scores`;
* :mod:`~dprc_core.auditing.gradient_canaries` — a white-box audit of a DP-SGD engine with
  Dirac gradient canaries: :func:`run_gradient_canary_audit`.

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

__all__ = [
    "AuditResult",
    "CanaryRun",
    "audit_scores",
    "epsilon_lower_bound",
    "linear_loss",
    "p_value",
    "run_gradient_canary_audit",
    "scores_from_updates",
]
