"""The ``dprc`` console script: the library's commands (``dprc_core.cli``) plus the service's
``serve`` and ``keys`` and the client's ``login``, ``files``, ``jobs`` and ``audit``
(``dprc.client``),
with ``dprc accountant … --server`` answered by a server through the client. It lives here, in
the composition root, so that ``dprc_core`` never imports the service or the client and
``api`` never imports ``worker``.

The client's commands are parsed without importing the library (whose engine imports torch):
``dprc files list`` starts in under a second. ``dprc accountant …`` is parsed first with
the command's own parser, standard library alone (:mod:`dprc.client.remote_accountant`): with
``--server`` a server answers and the library is never imported; ``--help`` and usage errors
exit before it is; the library (and torch) is imported only to compute here. Errors are one
line and exit status 2 on both paths."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dprc.client import commands as client_commands

if TYPE_CHECKING:
    from service.store import Store


def add_subparsers(sub: Any) -> None:
    """Register ``serve`` and ``keys`` on the ``dprc`` command's sub-parsers."""
    from service.roles import DEFAULT_ROLE, Role

    serve = sub.add_parser("serve", help="run the API server (uvicorn)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--log-level",
        default=None,
        help="log level of the server and its worker (default: DPRC_LOG_LEVEL)",
    )
    serve.set_defaults(func=_serve)

    keys = sub.add_parser("keys", help="manage API keys (tenants are created on demand)")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    create = ksub.add_parser("create", help="create a key; prints only the key on stdout")
    create.add_argument("--tenant", required=True)
    create.add_argument(
        "--role",
        default=DEFAULT_ROLE.value,
        choices=[r.value for r in Role],
        help="what the key may do (default: trainer; docs/governance.md)",
    )
    create.add_argument("--name", help="a label for the key (1 to 128 characters)")
    create.set_defaults(func=_keys_create)
    revoke = ksub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=_keys_revoke)
    lst = ksub.add_parser("list", help="list keys (id, tenant, role, prefix, created, state, name)")
    lst.add_argument("--json", action="store_true", help="one JSON object per line")
    lst.set_defaults(func=_keys_list)


def build_parser() -> argparse.ArgumentParser:
    from dprc.client import remote_accountant
    from dprc_core import cli as core_cli

    parser = core_cli.build_parser(extra_commands=[add_subparsers, client_commands.add_subparsers])
    # `dprc accountant epsilon|sigma --server` hands its request to the client
    parser.set_defaults(remote_accountant=remote_accountant.run)
    return parser


def build_client_parser() -> argparse.ArgumentParser:
    """The client's commands alone (same parsers as in :func:`build_parser`)."""
    parser = argparse.ArgumentParser(
        prog="dprc", description="Differentially private fine-tuning of language models."
    )
    client_commands.add_subparsers(parser.add_subparsers(dest="command", required=True))
    return parser


def _store() -> Store:
    from service.private_data import restrict_new_files
    from service.settings import Settings
    from service.store import open_store

    settings = Settings()
    restrict_new_files(settings.data_dir)
    return open_store(settings)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dprc.app import build_app
    from service.logging_setup import configure_logging
    from service.private_data import restrict_new_files
    from service.settings import get_settings

    settings = get_settings()
    level = args.log_level or settings.log_level
    configure_logging(level, settings.log_format)
    restrict_new_files(settings.data_dir)
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(args.host, args.host)  # a reachable one
    if settings.log_format == "json":
        logging.getLogger("dprc").info("dprc dashboard: http://%s:%s/", host, args.port)
    else:
        print(f"dprc dashboard: http://{host}:{args.port}/", file=sys.stderr, flush=True)
    # uvicorn's own X-Forwarded-* handling is off: the app believes the proxies of
    # DPRC_TRUSTED_PROXIES alone (the dashboard cookie's Secure flag, docs/deploy.md)
    options: dict[str, Any] = {}
    if settings.log_format == "json":  # uvicorn's own lines through the root handler too
        options["log_config"] = None
    uvicorn.run(
        build_app(),
        host=args.host,
        port=args.port,
        log_level=level.lower(),
        proxy_headers=False,
        **options,
    )
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from service.errors import DomainError
    from service.keys import create_key

    store = _store()
    with store.sessions() as session:
        try:
            key_id, secret = create_key(session, args.tenant, args.role, args.name)
        except DomainError as exc:  # a refused --name: one line, exit status 2
            raise ValueError(exc.message) from None
    print(f"created {args.role} key {key_id} for tenant {args.tenant!r}", file=sys.stderr)
    print(secret)
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from service.keys import revoke_key

    store = _store()
    with store.sessions() as session:
        if not revoke_key(session, args.key_id):
            raise ValueError(f"no such key: {args.key_id}")
    print(f"revoked {args.key_id}", file=sys.stderr)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    from service.keys import list_keys

    store = _store()
    with store.sessions() as session:
        for info in list_keys(session):
            if args.json:
                print(json.dumps(dataclasses.asdict(info), separators=(",", ":")))
                continue
            state = "revoked" if info.revoked_at is not None else "active"
            cells = [info.id, info.tenant, info.role, f"{info.prefix}...", str(info.created_at)]
            print("\t".join([*cells, state, info.name or "-"]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in client_commands.CLIENT_COMMANDS:
        return _run_client(build_client_parser(), argv)
    if argv and argv[0] == "accountant":
        return _accountant(argv)
    from dprc_core import cli as core_cli

    return core_cli.main(argv, parser=build_parser())


def _accountant(argv: list[str]) -> int:
    """``dprc accountant …``, parsed once, without the library: a server answers ``--server``
    (a client command); else the library computes (``dprc_core.cli.main``'s way)."""
    from dprc.client import remote_accountant

    args = remote_accountant.build_parser().parse_args(argv)
    if args.server is not None:
        args.func = remote_accountant.command
        return _run_parsed(args)
    from dprc_core import cli as core_cli
    from dprc_core.accounting import cli as accounting_cli

    args.func = accounting_cli.COMMANDS[args.accountant_command]
    return core_cli.run(args)


def _run_client(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    return _run_parsed(parser.parse_args(argv))


def _run_parsed(args: argparse.Namespace) -> int:
    """As ``dprc_core.cli.run``: a user error is one line on stderr and exit status 2."""
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError) as exc:
        print(f"dprc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
