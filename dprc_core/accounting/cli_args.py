"""The ``dprc accountant epsilon|sigma`` command's arguments and its ``--server`` request,
without torch or numpy.

:func:`add_subparser` registers the command (the one definition of its options: the library's
:mod:`dprc_core.accounting.cli` registers it through here); :func:`job` and :func:`dpftrl_job`
derive a job's q and steps, or its ν-DP-FTRL pattern, as the planner does; :func:`api_request`
builds the ``/v1/accountant`` request from the parsed arguments.

It imports the standard library and two light modules of the library: the names
(:mod:`dprc_core.mechanism_names`: envelope families, sketches, mechanisms, the default k) and
the step rule (:mod:`dprc_core.accounting.steps`). ``dprc_core`` and ``dprc_core.accounting``
import their names lazily, so the ``dprc`` console script imports this module for
``dprc accountant … --server`` (and for the command's ``--help`` and usage errors) without
torch, numpy or the accountant (tests/dprc/client/test_client_imports.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from dprc_core.accounting.steps import planned_steps
from dprc_core.mechanism_names import (
    DEFAULT_K,
    ENVELOPES,
    GAUSSIAN,
    NOISE_MECHANISMS,
    NU_DPFTRL,
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    SKETCHES,
)
from dprc_core.mechanism_names import canonical_mechanism as _canonical_mechanism

FTRL_ONLY = ("nu", "bands", "participations", "min_separation")  # ν-DP-FTRL's own options

Command = Callable[[argparse.Namespace], int]


def add_subparser(subparsers: Any, commands: Mapping[str, Command] | None = None) -> None:
    """Register the ``accountant`` command (with ``epsilon`` and ``sigma``); ``commands`` gives
    each sub-command's ``func`` (the library's computations), none for the client."""
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
    add_mechanism_arguments(eps)

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
    add_mechanism_arguments(sig)
    if commands is not None:
        eps.set_defaults(func=commands["epsilon"])
        sig.set_defaults(func=commands["sigma"])


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
        default=None,
        help="the accountant's envelope family: exact norms, or the hutch / hutchpp envelope "
        "of randomized norms (default exact; left out, epsilon also lists the other "
        "mechanisms a job could have run)",
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
        default=None,
        help="how the projections are drawn (hutch/hutchpp): shared by the batch (revealed "
        "scale, the default: a bound for both) or per example (hidden scale, "
        "docs/accounting.md section 10; the engine's default for randomized norms)",
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


def canonical_mechanism(value: str) -> str:
    """The one name of a mechanism (the spellings of earlier versions are accepted too):
    :func:`dprc_core.mechanism_names.canonical_mechanism` for the command line."""
    try:
        return _canonical_mechanism(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(NOISE_MECHANISMS)}") from None


def add_mechanism_arguments(parser: argparse.ArgumentParser) -> None:
    """``--mechanism`` and the ν-DP-FTRL options."""
    group = parser.add_argument_group("mechanism")
    group.add_argument(
        "--mechanism",
        type=canonical_mechanism,
        default=GAUSSIAN,
        help="gaussian (default; DP-SGD, Poisson sampling) or nu_dpftrl (correlated noise, "
        "fixed-order "
        "batches, no amplification)",
    )
    group.add_argument("--nu", type=float, help="nu_dpftrl: damping nu in [0, 1]")
    group.add_argument("--bands", type=int, help="nu_dpftrl: number of bands (default: none)")
    group.add_argument(
        "--participations", type=int, help="nu_dpftrl with --steps: max participations"
    )
    group.add_argument(
        "--min-separation", type=int, help="nu_dpftrl with --steps: min steps between them"
    )


def number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def job(args: argparse.Namespace) -> tuple[float, int, dict[str, Any]]:
    """A DP-SGD job's q, steps and the N/B/epochs it was given by (if so)."""
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
        return b / n, steps, {"dataset_size": n, "batch_size": b, "epochs": number(e)}
    if args.sample_rate is None or args.steps is None:
        raise ValueError(
            "give --sample-rate and --steps (or --dataset-size, --batch-size and --epochs)"
        )
    return args.sample_rate, args.steps, {}


def refuse_ftrl_options(args: argparse.Namespace) -> None:
    """A DP-SGD job given ν-DP-FTRL options is an error, not something to ignore."""
    given = [f"--{f.replace('_', '-')}" for f in FTRL_ONLY if getattr(args, f) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: only for --mechanism nu_dpftrl")


def dpftrl_job(args: argparse.Namespace) -> dict[str, Any]:
    """A ν-DP-FTRL job's steps and participation pattern (and its N/B/epochs if given so):
    :func:`dprc_core.accounting.dpftrl_cli._job`'s checks and pattern."""
    if args.sample_rate is not None:
        raise ValueError("nu_dpftrl uses fixed-order batches: --sample-rate does not apply")
    if args.envelope != "exact":
        raise ValueError(
            f"nu_dpftrl needs exact per-sample clipping, got clipping={args.envelope!r}: "
            "randomized clipping (hutch/hutchpp) with correlated noise has no privacy analysis"
        )
    if args.k is not None or args.rank is not None:
        raise ValueError("--k and --rank are for randomized clipping, which nu_dpftrl refuses")
    if getattr(args, "sketch", SHARED_SKETCH) != SHARED_SKETCH:
        raise ValueError("--sketch is for randomized clipping, which nu_dpftrl refuses")
    if args.nu is None:
        raise ValueError("--mechanism nu_dpftrl needs --nu")
    by_size = any(v is not None for v in (args.dataset_size, args.batch_size, args.epochs))
    if by_size:
        if (
            args.steps is not None
            or args.participations is not None
            or (args.min_separation is not None)
        ):
            raise ValueError(
                "give either --dataset-size/--batch-size/--epochs or "
                "--steps/--participations/--min-separation, not both"
            )
        if None in (args.dataset_size, args.batch_size, args.epochs):
            raise ValueError("--dataset-size, --batch-size and --epochs go together")
        n, b, e = args.dataset_size, args.batch_size, args.epochs
        if n < 1 or b < 1 or b > n or not (e >= 1 and float(e).is_integer()):
            raise ValueError("need 1 <= batch-size <= dataset-size and whole epochs >= 1")
        e = int(e)
        return {
            "steps": planned_steps(n, b, e, fixed_order=True),
            "participations": e,
            "min_separation": math.ceil(n / b),
            "dataset_size": n,
            "batch_size": b,
            "epochs": e,
        }
    if None in (args.steps, args.participations, args.min_separation):
        raise ValueError(
            "nu_dpftrl needs --dataset-size/--batch-size/--epochs, or --steps with "
            "--participations and --min-separation"
        )
    return {
        "steps": args.steps,
        "participations": args.participations,
        "min_separation": args.min_separation,
    }


def settle_mechanism(args: argparse.Namespace) -> bool:
    """Fill the accountant's defaults for a mechanism left partly unnamed (``--envelope``
    exact, ``--sketch`` shared: the revealed-scale bound holds for both sketches) and say
    whether it was: True when ``--envelope`` was left out, or a randomized envelope was given
    without ``--sketch`` — then the job's ε depends on what the job ran, and ``epsilon``
    lists the alternatives. Idempotent."""
    if hasattr(args, "mechanism_unnamed"):
        return bool(args.mechanism_unnamed)
    unnamed = args.envelope is None or (args.envelope != "exact" and args.sketch is None)
    args.envelope = args.envelope or "exact"
    args.sketch = args.sketch or SHARED_SKETCH
    mechanism = MECHANISM_OPTIONS[getattr(args, "mechanism", GAUSSIAN)]
    args.mechanism_unnamed = unnamed and mechanism.has_envelope
    return bool(args.mechanism_unnamed)


# What a job could have run with one σ, q and steps, listed by ``epsilon`` when it is not told
# which (randomized norms at --k, default DEFAULT_K as the engine's; the engine's default
# sketch for them is per-example, dprc_core.accounting.events.default_sketch)
ALTERNATIVES = (
    ("exact", None),
    ("hutch", PER_EXAMPLE_SKETCH),
    ("hutch", SHARED_SKETCH),
    ("hutchpp", PER_EXAMPLE_SKETCH),
    ("hutchpp", SHARED_SKETCH),
)


def alternatives(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The mechanisms of :data:`ALTERNATIVES` as accountant settings (envelope, k, rank,
    sketch), ``--k`` and ``--rank`` applied where they mean something."""
    k = args.k if args.k is not None else DEFAULT_K
    return [
        {
            "envelope": envelope,
            "k": k if sketch is not None else None,
            "rank": args.rank if envelope == "hutch" else None,
            "sketch": sketch or SHARED_SKETCH,
            "default_sketch": sketch == PER_EXAMPLE_SKETCH,
        }
        for envelope, sketch in ALTERNATIVES
    ]


def print_alternatives(rows: list[dict[str, Any]]) -> None:
    """The table of ε by mechanism (rows of :func:`alternatives` with their ``epsilon``)."""
    print("the same noise multiplier, sample rate and steps under each mechanism a job could")
    print("have run (name the job's with --envelope, --k and --sketch):")
    for row in rows:
        if row["envelope"] == "exact":
            label = "exact norms"
        else:
            sketch = "per-example" if row["sketch"] == PER_EXAMPLE_SKETCH else "shared"
            label = f"{row['envelope']} k={row['k']}, {sketch} sketch"
            if row["default_sketch"]:
                label += " (default sketch)"
        eps = row["epsilon"]
        text = f"{eps:.6g}" if isinstance(eps, float) else "no finite bound"
        print(f"  {label:<48} epsilon = {text}")


def _gaussian_body(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    refuse_ftrl_options(args)
    q, steps, _extra = job(args)
    body = {"sample_rate": q, "steps": steps, "clipping": args.envelope}
    body.update({"k": args.k, "rank": args.rank})
    if args.sketch != SHARED_SKETCH:  # the server's default otherwise
        body["sketch"] = args.sketch
    if kind == "sigma":
        body["rel_tol"] = args.rel_tol
    return body


def _dpftrl_body(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    pattern = dpftrl_job(args)  # the local command's checks and pattern
    return {
        "mechanism": NU_DPFTRL,
        "nu": args.nu,
        "bands": args.bands,
        "steps": pattern["steps"],
        "participations": pattern["participations"],
        "min_separation": pattern["min_separation"],
    }


class MechanismOptions(NamedTuple):
    """What the command does with one mechanism (by its name: this module cannot read the
    library's event classes): the job part of its ``/v1/accountant`` request (``kind``:
    epsilon or sigma), and whether the mechanism has an envelope to choose (then ``epsilon``
    of a job that does not name it lists the alternatives)."""

    body: Callable[[argparse.Namespace, str], dict[str, Any]]
    has_envelope: bool


MECHANISM_OPTIONS: dict[str, MechanismOptions] = {
    GAUSSIAN: MechanismOptions(_gaussian_body, has_envelope=True),
    NU_DPFTRL: MechanismOptions(_dpftrl_body, has_envelope=False),
}


def api_request(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The ``/v1/accountant`` request body (``kind``: epsilon or sigma) for these arguments,
    with q and steps derived as the local command derives them."""
    settle_mechanism(args)
    body = MECHANISM_OPTIONS[args.mechanism].body(args, kind)
    if kind == "epsilon":
        body.update({"noise_multiplier": args.noise_multiplier, "delta": args.delta})
    else:
        body.update({"target_epsilon": args.epsilon, "target_delta": args.delta})
    return body
