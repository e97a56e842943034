"""``--mechanism nu_dpftrl`` for ``dprc accountant epsilon`` and ``dprc accountant sigma``.

The options are registered by :mod:`dprc_core.accounting.cli_args`; :func:`epsilon` and
:func:`sigma` compute a ν-DP-FTRL job's result and headline, which
:mod:`dprc_core.accounting.cli` prints.

A ν-DP-FTRL job is given by ``--dataset-size N --batch-size B --epochs E`` (fixed-order
batches, :class:`~dprc_core.training.sampling.FixedOrderSampler`: steps = E·⌈N/B⌉, at most E
participations, ⌈N/B⌉ steps apart) or by ``--steps`` with ``--participations`` and
``--min-separation``. There is no sampling rate: no amplification is claimed.
"""

from __future__ import annotations

import argparse
from typing import Any

from dprc_core.accounting import cli_args
from dprc_core.accounting.describe import ADJACENCY, NU_DPFTRL_ACCOUNTANT
from dprc_core.accounting.dpftrl import (
    check_dpftrl_envelope,
    dpftrl_epsilon,
    dpftrl_noise_multiplier,
    dpftrl_sensitivity_details,
)
from dprc_core.mechanism_names import NU_DPFTRL


def _job(args: argparse.Namespace) -> dict[str, Any]:
    """The job's steps and participation pattern: the one rule of
    :func:`dprc_core.accounting.cli_args.dpftrl_job` (the client's too), after the library's
    own envelope check."""
    if args.sample_rate is None:
        check_dpftrl_envelope(args.envelope)
    return cli_args.dpftrl_job(args)


def _result(sigma: float, delta: float, nu: float, bands: int | None, job: dict) -> dict:
    details = dpftrl_sensitivity_details(
        nu, job["steps"], job["participations"], job["min_separation"], bands
    )
    eps = dpftrl_epsilon(
        sigma, delta, nu, job["steps"], job["participations"], job["min_separation"], bands
    )
    return {
        "epsilon": eps,
        "noise_multiplier": sigma,
        "delta": delta,
        "mechanism": NU_DPFTRL,
        "nu": nu,
        "bands": bands,
        **job,
        "sensitivity": details.value,
        "sensitivity_method": details.method + (" (exact)" if details.exact else ""),
        "mu": details.value / sigma,
        "clipping": "exact",
        "adjacency": ADJACENCY[NU_DPFTRL],
        "accountant": NU_DPFTRL_ACCOUNTANT,
    }


def epsilon(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    job = _job(args)
    result = _result(args.noise_multiplier, args.delta, args.nu, args.bands, job)
    return result, f"epsilon = {result['epsilon']:.6g} (exact Gaussian, nu_dpftrl)"


def sigma(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    job = _job(args)
    sigma = dpftrl_noise_multiplier(
        args.epsilon,
        args.delta,
        args.nu,
        job["steps"],
        job["participations"],
        job["min_separation"],
        args.bands,
    )
    result = _result(sigma, args.delta, args.nu, args.bands, job)
    result = {"target_epsilon": args.epsilon, **result}
    headline = (
        f"noise_multiplier = {sigma:.6g} (nu_dpftrl, smallest with epsilon <= "
        f"{args.epsilon:g}; achieved epsilon = {result['epsilon']:.6g})"
    )
    return result, headline
