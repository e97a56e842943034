"""``dprc accountant epsilon|sigma --server [URL]``: the library's accountant command, answered
by a dprc server (``POST /v1/accountant/epsilon`` or ``/noise_multiplier``).

The command's options and its request (:func:`dprc_core.accounting.cli_args.api_request`, q
and steps derived as the local command derives them) are defined once, in
:mod:`dprc_core.accounting.cli_args`, a module of the standard library alone. Importing it the
usual way would run ``dprc_core/__init__.py``, which imports the engine and torch (seconds), so
:func:`accountant_args` reads it from its file instead: ``dprc accountant … --server`` starts
as fast as the other client commands, and imports neither torch nor numpy."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from dprc.client.api import Client
from dprc.client.config import load_config

ACCOUNTANT_ARGS = "dprc_core.accounting.cli_args"


@functools.cache
def accountant_args() -> ModuleType:
    """:mod:`dprc_core.accounting.cli_args` without importing the ``dprc_core`` package: the
    imported module when the library is loaded already, else the module read from its file
    (found through ``dprc_core``'s spec, which imports nothing)."""
    loaded = sys.modules.get(ACCOUNTANT_ARGS)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("dprc_core")
    folders = (package.submodule_search_locations or []) if package is not None else []
    for folder in folders:
        path = Path(folder, *ACCOUNTANT_ARGS.split(".")[1:]).with_suffix(".py")
        if not path.is_file():
            continue
        spec = importlib.util.spec_from_file_location("dprc.client._accountant_args", path)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"cannot find {ACCOUNTANT_ARGS} (is dprc_core installed?)")


def build_parser() -> argparse.ArgumentParser:
    """``dprc accountant …`` alone: the same options, sub-commands, help and usage errors as
    the ``accountant`` of the whole ``dprc`` parser, without a ``func`` (the caller decides
    whether the library computes or a server answers)."""
    parser = argparse.ArgumentParser(
        prog="dprc", description="Differentially private fine-tuning of language models."
    )
    accountant_args().add_subparser(parser.add_subparsers(dest="command", required=True))
    return parser


def command(args: argparse.Namespace) -> int:
    """Send the parsed ``accountant epsilon|sigma … --server`` to the server; print its
    answer."""
    kind = args.accountant_command
    return run(kind, accountant_args().api_request(args, kind), args)


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
        accountant_args().print_alternatives(rows)
    return 0


def _alternatives(
    client: Client, body: dict[str, Any], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """ε of the same job under each mechanism it could have run, asked of the server."""
    rows = []
    for alt in accountant_args().alternatives(args):
        ask = {**body, "clipping": alt["envelope"], "k": alt["k"], "rank": alt["rank"]}
        ask.pop("sketch", None)
        if alt["sketch"] != "shared":
            ask["sketch"] = alt["sketch"]
        rows.append({**alt, "epsilon": client.accountant("epsilon", ask).get("epsilon")})
    return rows
