"""The ``dprc`` command line.

Each domain contributes its own sub-commands through an ``add_subparser(subparsers)``
function, so this module only wires them together. Building the parser imports no torch and
no accountant (each command imports what it needs when it runs): ``dprc --help`` and every
usage error start in well under a second (docs/benchmarks/client_startup.md). The installed
``dprc`` script is ``dprc.cli:main``, which adds the service's commands (``serve``, ``keys``)
through ``extra_commands``; this library never imports the service.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any


def build_parser(
    extra_commands: Sequence[Callable[[Any], None]] = (),
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dprc", description="Differentially private fine-tuning of language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    from dprc_core.accounting import cli_args

    # the accountant's options, without the accountant: it is imported to compute
    cli_args.add_subparser(sub, dict.fromkeys(("epsilon", "sigma"), _accountant))
    from dprc_core.training import cli as training_cli

    training_cli.add_subparser(sub)
    from dprc_core.synthetic import cli as synthetic_cli

    synthetic_cli.add_subparser(sub)

    demo = sub.add_parser("demo", help="DP fine-tune a tiny local Llama end to end (library)")
    demo.add_argument("--out", default="runs/demo", help="output folder")
    demo.add_argument("--epsilon", type=float, default=8.0)
    demo.set_defaults(func=_demo)
    for add_subparser in extra_commands:
        add_subparser(sub)
    return parser


def _accountant(args: argparse.Namespace) -> int:
    """``dprc accountant epsilon|sigma``: the library's command
    (:data:`dprc_core.accounting.cli.COMMANDS`), imported when it runs (numpy, dp_accounting),
    not when the parser is built (``dprc --help`` starts without them)."""
    from dprc_core.accounting import cli as accounting_cli

    return accounting_cli.COMMANDS[args.accountant_command](args)


def _demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dprc_core.training.demo import run

    run(Path(args.out), epsilon=args.epsilon)
    return 0


def main(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or build_parser()
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run a parsed command (its ``func``): a user error is one line and exit status 2."""
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError) as exc:  # user errors: one clear line, non-zero exit
        print(f"dprc: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
