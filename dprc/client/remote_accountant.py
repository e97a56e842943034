"""``dprc accountant epsilon|sigma --server [URL]``: the library's accountant command, answered
by a dprc server (``POST /v1/accountant/epsilon`` or ``/noise_multiplier``).

The command's options and its request (:func:`dprc_core.accounting.cli_args.api_request`, q
and steps derived as the local command derives them) are defined once, in
:mod:`dprc_core.accounting.cli_args`, which imports neither torch nor numpy; ``dprc_core`` and
``dprc_core.accounting`` import their names lazily, so importing it loads neither the engine
nor the accountant: ``dprc accountant … --server`` starts as fast as the other client
commands. The client imports the ``openai`` SDK only to send a request, so the library's own
``dprc accountant`` and the command's usage errors do without it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dprc.client.api import Client
from dprc.client.config import load_config
from dprc_core.accounting import cli_args


def build_parser() -> argparse.ArgumentParser:
    """``dprc accountant …`` alone: the same options, sub-commands, help and usage errors as
    the ``accountant`` of the whole ``dprc`` parser, without a ``func`` (the caller decides
    whether the library computes or a server answers)."""
    parser = argparse.ArgumentParser(
        prog="dprc", description="Differentially private fine-tuning of language models."
    )
    cli_args.add_subparser(parser.add_subparsers(dest="command", required=True))
    return parser


def command(args: argparse.Namespace) -> int:
    """Send the parsed ``accountant epsilon|sigma … --server`` to the server; print its
    answer."""
    kind = args.accountant_command
    return run(kind, cli_args.api_request(args, kind), args)


def run(kind: str, body: dict[str, Any], args: argparse.Namespace) -> int:
    config = load_config(args.server or None)
    client = Client(config)
    result = client.accountant(kind, body)
    rows = None
    if kind == "epsilon" and getattr(args, "mechanism_unnamed", False):
        rows = _alternatives(client, body, args)
        result["by_mechanism"] = rows
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    eps = result.get("epsilon")
    eps_text = f"{eps:.6g}" if isinstance(eps, float) else "no finite bound"
    if kind == "epsilon":
        print(f"epsilon = {eps_text} (upper bound; computed by {config.server_url})")
    else:
        print(
            f"noise_multiplier = {result['noise_multiplier']:.6g} (achieved epsilon = "
            f"{eps_text}; computed by {config.server_url})"
        )
    print("settings:")
    shown = "epsilon" if kind == "epsilon" else "noise_multiplier"
    for key, value in result.items():
        if key not in (shown, "object", "by_mechanism"):
            print(f"  {key}: {value}")
    if rows is not None:
        cli_args.print_alternatives(rows)
    return 0


def _alternatives(
    client: Client, body: dict[str, Any], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """ε of the same job under each mechanism it could have run, asked of the server."""
    rows = []
    for alt in cli_args.alternatives(args):
        ask = {**body, "clipping": alt["envelope"], "k": alt["k"], "rank": alt["rank"]}
        ask.pop("sketch", None)
        if alt["sketch"] != "shared":
            ask["sketch"] = alt["sketch"]
        rows.append({**alt, "epsilon": client.accountant("epsilon", ask).get("epsilon")})
    return rows
