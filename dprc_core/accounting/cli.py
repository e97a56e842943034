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
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from dprc_core.accounting import dpftrl_cli
from dprc_core.accounting.accountant import DEFAULT_SETTINGS, account
from dprc_core.accounting.calibration import noise_multiplier
from dprc_core.accounting.describe import describe_event
from dprc_core.accounting.events import (
    ENVELOPES,
    SHARED_SKETCH,
    SKETCHES,
    PrivacyEvent,
    SubsampledGaussianEvent,
)
from dprc_core.accounting.steps import planned_steps
from dprc_core.mechanism_names import NU_DPFTRL


def add_subparser(subparsers: Any) -> None:
    """Register the ``accountant`` command (with ``epsilon`` and ``sigma``)."""
    acc = subparsers.add_parser(
        "accountant",
        help="privacy accountant: epsilon of a job, or the noise multiplier for a target",
        description="PLD privacy accountant for DP-SGD and DP-SGD with randomized clipping "
        "(add/remove adjacency, Poisson sampling; every epsilon is an upper bound).",
    )
    sub = acc.add_subparsers(dest="accountant_command", required=True)

    eps = sub.add_parser("epsilon", help="epsilon for a noise multiplier")
    eps.add_argument(
        "--noise-multiplier",
        "--sigma",
        dest="noise_multiplier",
        type=float,
        required=True,
        help="noise std / clipping norm",
    )
    eps.add_argument("--delta", type=float, required=True)
    _add_job_arguments(eps)
    dpftrl_cli.add_arguments(eps)
    eps.set_defaults(func=_epsilon_command)

    sig = sub.add_parser("sigma", help="smallest noise multiplier reaching a target epsilon")
    sig.add_argument("--epsilon", type=float, required=True, help="target epsilon")
    sig.add_argument("--delta", type=float, required=True)
    sig.add_argument(
        "--rel-tol",
        type=float,
        default=0.005,
        help="relative precision of the noise multiplier (default 0.005)",
    )
    _add_job_arguments(sig)
    dpftrl_cli.add_arguments(sig)
    sig.set_defaults(func=_sigma_command)


class _DeprecatedClipping(argparse.Action):
    """``--clipping``: the envelope under its earlier option name, with a note on stderr."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print("dprc: note: --clipping is deprecated, use --envelope", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    job = parser.add_argument_group("job (either --sample-rate/--steps or N/B/epochs)")
    job.add_argument("--sample-rate", "-q", type=float, help="Poisson sampling rate")
    job.add_argument("--steps", type=int, help="number of noisy steps")
    job.add_argument("--dataset-size", type=int, help="N (gives q = B/N)")
    job.add_argument("--batch-size", type=int, help="expected batch size B")
    job.add_argument("--epochs", type=float, help="epochs (steps = ceil(epochs * N / B))")
    clip = parser.add_argument_group("envelope")
    clip.add_argument(
        "--envelope",
        choices=ENVELOPES,
        default="exact",
        help="the accountant's envelope family: exact norms, or the hutch / hutchpp envelope "
        "of randomized norms (default exact)",
    )
    clip.add_argument(
        "--clipping",
        choices=ENVELOPES,
        dest="envelope",
        default=argparse.SUPPRESS,
        action=_DeprecatedClipping,
        help="deprecated spelling of --envelope",
    )
    clip.add_argument("--k", type=int, help="projection dimension (hutch/hutchpp)")
    clip.add_argument(
        "--rank",
        type=int,
        help="total rank D = sum over randomized layers of min(p, d) (hutch only; "
        "default: dimension-free envelope)",
    )
    clip.add_argument(
        "--sketch",
        choices=SKETCHES,
        default=SHARED_SKETCH,
        help="how the projections are drawn (hutch/hutchpp): shared by the batch (revealed "
        "scale) or per example (hidden scale, docs/accounting.md section 10)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--server",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="ask a dprc server (URL, or the configured one: DPRC_SERVER_URL or the client "
        "config) instead of computing here",
    )


def _job(args: argparse.Namespace) -> tuple[float, int, dict[str, Any]]:
    by_rate = args.sample_rate is not None or args.steps is not None
    by_size = any(v is not None for v in (args.dataset_size, args.batch_size, args.epochs))
    if by_rate and by_size:
        raise ValueError(
            "give either --sample-rate/--steps or --dataset-size/--batch-size/--epochs, not both"
        )
    if by_size:
        if None in (args.dataset_size, args.batch_size, args.epochs):
            raise ValueError("--dataset-size, --batch-size and --epochs go together")
        n, b, e = args.dataset_size, args.batch_size, args.epochs
        if n < 1 or b < 1 or not e > 0 or b > n:
            raise ValueError("need 1 <= batch-size <= dataset-size and epochs > 0")
        steps = planned_steps(n, b, e)
        return b / n, steps, {"dataset_size": n, "batch_size": b, "epochs": _number(e)}
    if args.sample_rate is None or args.steps is None:
        raise ValueError(
            "give --sample-rate and --steps (or --dataset-size, --batch-size and --epochs)"
        )
    return args.sample_rate, args.steps, {}


def _number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _report(result: dict[str, Any], as_json: bool, headline: str, shown: str) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    print(headline)
    print("settings:")
    for key, value in result.items():
        if key != shown:
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


def api_request(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The ``/v1/accountant`` request body (``kind``: epsilon or sigma) for these arguments,
    with q and steps derived as the local command derives them."""
    if args.mechanism == NU_DPFTRL:
        job = dpftrl_cli._job(args)  # the local command's checks and pattern
        body: dict[str, Any] = {
            "mechanism": NU_DPFTRL,
            "nu": args.nu,
            "bands": args.bands,
            "steps": job["steps"],
            "participations": job["participations"],
            "min_separation": job["min_separation"],
        }
    else:
        dpftrl_cli.refuse_ftrl_options(args)
        q, steps, _extra = _job(args)
        body = {"sample_rate": q, "steps": steps, "clipping": args.envelope}
        body.update({"k": args.k, "rank": args.rank})
        if args.sketch != SHARED_SKETCH:  # the server's default otherwise
            body["sketch"] = args.sketch
        if kind == "sigma":
            body["rel_tol"] = args.rel_tol
    if kind == "epsilon":
        body.update({"noise_multiplier": args.noise_multiplier, "delta": args.delta})
    else:
        body.update({"target_epsilon": args.epsilon, "target_delta": args.delta})
    return body


def _remote(args: argparse.Namespace, kind: str) -> int:
    handler = getattr(args, "remote_accountant", None)
    if handler is None:
        raise ValueError("--server needs the dprc client (run the `dprc` console script)")
    return int(handler(kind, api_request(args, kind), args))


def _epsilon_command(args: argparse.Namespace) -> int:
    if args.server is not None:
        return _remote(args, "epsilon")
    if args.mechanism == NU_DPFTRL:
        result, headline = dpftrl_cli.epsilon(args)
        _report(result, args.json, headline, "epsilon")
        return 0
    dpftrl_cli.refuse_ftrl_options(args)
    q, steps, extra = _job(args)
    event = SubsampledGaussianEvent(
        args.noise_multiplier, q, steps, args.envelope, args.k, args.rank, args.sketch
    )
    result = _common(event, args.delta, extra)
    _report(result, args.json, f"epsilon = {result['epsilon']:.6g} (upper bound)", "epsilon")
    return 0


def _sigma_command(args: argparse.Namespace) -> int:
    if args.server is not None:
        return _remote(args, "sigma")
    if args.mechanism == NU_DPFTRL:
        result, headline = dpftrl_cli.sigma(args)
        _report(result, args.json, headline, "noise_multiplier")
        return 0
    dpftrl_cli.refuse_ftrl_options(args)
    q, steps, extra = _job(args)
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
    return 0
