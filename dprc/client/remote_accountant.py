"""``dprc accountant epsilon|sigma --server [URL]``: the library's accountant command, answered
by a dprc server (``POST /v1/accountant/epsilon`` or ``/noise_multiplier``). The request is
built by :func:`dprc_core.accounting.cli.api_request` from the same arguments."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dprc.client.api import Client
from dprc.client.config import load_config


def run(kind: str, body: dict[str, Any], args: argparse.Namespace) -> int:
    config = load_config(args.server or None)
    result = Client(config).accountant(kind, body)
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
        if key not in (shown, "object"):
            print(f"  {key}: {value}")
    return 0
