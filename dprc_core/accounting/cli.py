"""``dprc accountant epsilon …`` and ``dprc accountant sigma …``.

Both print the result together with every setting that produced it (``--json`` for a
machine-readable object). A job is given either by ``--sample-rate`` and ``--steps`` or by
``--dataset-size``, ``--batch-size`` and ``--epochs`` (q = B/N, steps = ⌈epochs·N/B⌉: the
planner's rule, :func:`dprc_core.accounting.steps.planned_steps`, so the steps calibrated here
are the steps ``dprc train`` and the service run). ``--mechanism nu_dpftrl`` routes to
:mod:`dprc_core.accounting.dpftrl_cli`, which computes and returns; this module prints.

``--envelope`` names the accountant's envelope family (exact | hutch | hutchpp);
``--clipping`` is its deprecated spelling (accepted with a note on stderr).

``--server [URL]`` sends the same job to a dprc server's ``/v1/accountant`` instead
(:func:`api_request` builds the request from the same arguments, so q and steps are the
planner's here too). The server's client is supplied by the ``dprc`` console script as the
``remote_accountant`` default: this library imports no client.

The command's options, its job rule and the request live in
:mod:`dprc_core.accounting.cli_args`, which imports only the standard library: the ``dprc``
console script parses ``dprc accountant …`` with it before deciding whether the library (and
torch) is needed at all; this module adds the computations (:data:`COMMANDS`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from dprc_core.accounting import cli_args, dpftrl_cli
from dprc_core.accounting.accountant import DEFAULT_SETTINGS, account
from dprc_core.accounting.calibration import noise_multiplier
from dprc_core.accounting.describe import describe_event
from dprc_core.accounting.events import (
    NuDPFTRLEvent,
    PrivacyEvent,
    SubsampledGaussianEvent,
    event_type_named,
)


def add_subparser(subparsers: Any) -> None:
    """Register the ``accountant`` command (with ``epsilon`` and ``sigma``)."""
    cli_args.add_subparser(subparsers, COMMANDS)


def _report(result: dict[str, Any], as_json: bool, headline: str, shown: str) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    print(headline)
    print("settings:")
    for key, value in result.items():
        if key not in (shown, "by_mechanism"):
            print(f"  {key}: {value}")


def _common(event: PrivacyEvent, delta: float, extra: dict[str, Any]) -> dict[str, Any]:
    res = account([event], delta, DEFAULT_SETTINGS)
    return {
        "epsilon": res.epsilon,
        "noise_multiplier": event.noise_multiplier,
        "delta": delta,
        "sample_rate": event.sample_rate,
        "steps": event.steps,
        **extra,
        "clipping": event.envelope,
        "k": event.k,
        "rank": event.rank,
        **describe_event(event),
        "accountant": res.describe(),
    }


api_request = cli_args.api_request  # the request ``--server`` sends (built without the library)


def _remote(args: argparse.Namespace, kind: str) -> int:
    handler = getattr(args, "remote_accountant", None)
    if handler is None:
        raise ValueError("--server needs the dprc client (run the `dprc` console script)")
    return int(handler(kind, api_request(args, kind), args))


def _alternatives(args: argparse.Namespace, q: float, steps: int) -> list[dict[str, Any]]:
    """ε of the same σ, q and steps under each mechanism a job could have run
    (:func:`cli_args.alternatives`), computed here."""
    rows = []
    for alt in cli_args.alternatives(args):
        event = SubsampledGaussianEvent(
            args.noise_multiplier, q, steps, alt["envelope"], alt["k"], alt["rank"], alt["sketch"]
        )
        rows.append({**alt, "epsilon": account([event], args.delta, DEFAULT_SETTINGS).epsilon})
    return rows


def _gaussian_epsilon(args: argparse.Namespace, unnamed: bool) -> None:
    cli_args.refuse_ftrl_options(args)
    q, steps, extra = cli_args.job(args)
    event = SubsampledGaussianEvent(
        args.noise_multiplier, q, steps, args.envelope, args.k, args.rank, args.sketch
    )
    result = _common(event, args.delta, extra)
    rows = _alternatives(args, q, steps) if unnamed else None
    if rows is not None:
        result["by_mechanism"] = rows
    _report(result, args.json, f"epsilon = {result['epsilon']:.6g} (upper bound)", "epsilon")
    if rows is not None and not args.json:
        cli_args.print_alternatives(rows)


def _gaussian_sigma(args: argparse.Namespace) -> None:
    cli_args.refuse_ftrl_options(args)
    q, steps, extra = cli_args.job(args)
    sigma = noise_multiplier(
        args.epsilon,
        args.delta,
        q,
        steps,
        args.envelope,
        args.k,
        args.rank,
        sketch=args.sketch,
        rel_tol=args.rel_tol,
    )
    event = SubsampledGaussianEvent(sigma, q, steps, args.envelope, args.k, args.rank, args.sketch)
    result = _common(event, args.delta, extra)
    result = {"target_epsilon": args.epsilon, "rel_tol": args.rel_tol, **result}
    headline = (
        f"noise_multiplier = {sigma:.6g} (smallest within {args.rel_tol:g} relative with "
        f"epsilon <= {args.epsilon:g}; achieved epsilon = {result['epsilon']:.6g})"
    )
    _report(result, args.json, headline, "noise_multiplier")


def _dpftrl_epsilon(args: argparse.Namespace, unnamed: bool) -> None:
    result, headline = dpftrl_cli.epsilon(args)
    _report(result, args.json, headline, "epsilon")


def _dpftrl_sigma(args: argparse.Namespace) -> None:
    result, headline = dpftrl_cli.sigma(args)
    _report(result, args.json, headline, "noise_multiplier")


# The commands of each event class (``--mechanism`` names its registered class).
_EPSILON: dict[type[PrivacyEvent], Callable[[argparse.Namespace, bool], None]] = {
    SubsampledGaussianEvent: _gaussian_epsilon,
    NuDPFTRLEvent: _dpftrl_epsilon,
}
_SIGMA: dict[type[PrivacyEvent], Callable[[argparse.Namespace], None]] = {
    SubsampledGaussianEvent: _gaussian_sigma,
    NuDPFTRLEvent: _dpftrl_sigma,
}


def _epsilon_command(args: argparse.Namespace) -> int:
    unnamed = cli_args.settle_mechanism(args)
    if args.server is not None:
        return _remote(args, "epsilon")
    _EPSILON[event_type_named(args.mechanism)](args, unnamed)
    return 0


def _sigma_command(args: argparse.Namespace) -> int:
    cli_args.settle_mechanism(args)
    if args.server is not None:
        return _remote(args, "sigma")
    _SIGMA[event_type_named(args.mechanism)](args)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "epsilon": _epsilon_command,
    "sigma": _sigma_command,
}
