"""The ``dprc`` console script: the library's commands (``dprc_core.cli``) plus the service's
``serve``, ``keys`` and ``admin`` (backup, restore, check, acknowledge) and the client's
``login``, ``files``, ``jobs`` and ``audit`` (``dprc.client``), with ``dprc accountant …
--server`` answered by a server through the client. It lives here, in the composition root, so
that ``dprc_core`` never imports the service or the client and ``api`` never imports
``worker``.

No command imports torch to start: ``dprc_core`` imports its names lazily, the client's
commands are parsed without the library's engine (``dprc files list`` starts in under a
second), and ``dprc --help`` builds every parser without torch or the accountant.
``dprc accountant …`` is parsed first with the command's own parser, without the client or
numpy (:mod:`dprc.client.remote_accountant`, :mod:`dprc_core.accounting.cli_args`): with
``--server`` a server answers through the client and the accountant is never imported;
``--help`` and usage errors exit before anything heavy is; the accountant (numpy,
dp_accounting, no torch) is imported only to compute here. Errors are one line and exit status
2 on both paths (tests/dprc/test_startup_imports.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.store.store import Store


def add_subparsers(sub: Any) -> None:
    """Register ``serve``, ``keys`` and ``admin`` on the ``dprc`` command's sub-parsers."""
    from service.governance.roles import DEFAULT_ROLE, Role

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
    _add_admin(sub)


def _add_admin(sub: Any) -> None:
    admin = sub.add_parser(
        "admin", help="the privacy record: backup, restore, check, acknowledge (server's host)"
    )
    asub = admin.add_subparsers(dest="admin_command", required=True)
    backup = asub.add_parser(
        "backup", help="write the database, the job ledgers and a manifest into a new folder"
    )
    backup.add_argument("dir", help="a new (or empty) folder")
    backup.set_defaults(func=_admin_backup)
    restore = asub.add_parser(
        "restore",
        help="restore a backup (the server stopped); data sets with jobs after it are frozen",
    )
    restore.add_argument("dir", help="a folder written by `dprc admin backup`")
    restore.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    restore.add_argument(
        "--freeze-all",
        action="store_true",
        help="freeze every data set, whatever the data volume shows (e.g. it was lost)",
    )
    restore.set_defaults(func=_admin_restore)
    check = asub.add_parser(
        "check",
        help="every job's ledger agrees with the database, no data set beyond its budget "
        "(exit 1 and one line per problem otherwise)",
    )
    check.set_defaults(func=_admin_check)
    ack = asub.add_parser("acknowledge", help="lift a data set's freeze (audited)")
    ack.add_argument("group_id", help="the data set's budget group (budget_group of its files)")
    ack.add_argument("--reason", required=True, help="why (1 to 1000 characters; audited)")
    ack.set_defaults(func=_admin_acknowledge)


def build_parser() -> argparse.ArgumentParser:
    from dprc.client import commands as client_commands
    from dprc.client import remote_accountant
    from dprc_core import cli as core_cli

    parser = core_cli.build_parser(extra_commands=[add_subparsers, client_commands.add_subparsers])
    # `dprc accountant epsilon|sigma --server` hands its request to the client
    parser.set_defaults(remote_accountant=remote_accountant.run)
    return parser


def build_client_parser() -> argparse.ArgumentParser:
    """The client's commands alone (same parsers as in :func:`build_parser`)."""
    from dprc.client import commands as client_commands

    parser = argparse.ArgumentParser(
        prog="dprc", description="Differentially private fine-tuning of language models."
    )
    client_commands.add_subparsers(parser.add_subparsers(dest="command", required=True))
    return parser


def _store() -> Store:
    from service.base.settings import Settings
    from service.data.private_data import restrict_new_files
    from service.data.rekey import open_current_store

    settings = Settings()
    restrict_new_files(settings.data_dir)
    return open_current_store(settings)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dprc.app import build_app
    from service.base.logging_setup import configure_logging
    from service.base.settings import get_settings
    from service.data.private_data import restrict_new_files

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
    from service.base.errors import DomainError
    from service.governance.keys import create_key

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
    from service.governance.keys import revoke_key

    store = _store()
    with store.sessions() as session:
        if not revoke_key(session, args.key_id):
            raise ValueError(f"no such key: {args.key_id}")
    print(f"revoked {args.key_id}", file=sys.stderr)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    from service.governance.keys import list_keys

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


def _admin_backup(args: argparse.Namespace) -> int:
    from pathlib import Path

    from service.admin.backup import backup

    store = _store()
    try:
        m = backup(store, Path(args.dir))
    finally:
        store.engine.dispose()
    ledgers = sum(1 for f in m.files if f.startswith("ledgers/") and f.endswith(".json"))
    keys = sum(1 for f in m.files if f.startswith("secrets/"))
    print(
        f"backup of {m.created_at_utc} in {args.dir}: {m.database_kind} database at migration "
        f"{m.alembic_revision} ({len(m.jobs)} jobs, {len(m.groups)} data sets), {ledgers} job "
        f"ledgers, {keys} tenant keys; manifest.json holds their SHA-256"
    )
    return 0


def _admin_restore(args: argparse.Namespace) -> int:
    from pathlib import Path

    from service.admin.restore import manifest_summary, report_lines, restore
    from service.base.settings import Settings
    from service.data.private_data import restrict_new_files

    settings = Settings()
    folder = Path(args.dir)
    if not args.yes:
        if not sys.stdin.isatty():
            raise ValueError("a restore replaces the database: pass --yes to confirm")
        try:
            summary = manifest_summary(folder)
        except (OSError, ValueError):
            summary = str(folder)
        answer = input(f"replace the database with the {summary}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not restored", file=sys.stderr)
            return 1
    restrict_new_files(settings.data_dir)
    for line in report_lines(restore(settings, folder, freeze_all=args.freeze_all)):
        print(line)
    return 0


def _admin_check(args: argparse.Namespace) -> int:
    from service.admin.consistency import check, report_lines

    store = _store()
    try:
        report = check(store)
    finally:
        store.engine.dispose()
    out, notes = report_lines(report)
    for line in notes:
        print(line, file=sys.stderr)
    for line in out:
        print(line)
    return 0 if report.ok else 1


def _admin_acknowledge(args: argparse.Namespace) -> int:
    from service.base.errors import DomainError
    from service.budget.freezes import acknowledge_on_shell

    store = _store()
    try:
        state = acknowledge_on_shell(store, args.group_id, args.reason)
    except DomainError as exc:
        raise ValueError(exc.message) from None
    finally:
        store.engine.dispose()
    print(f"acknowledged: data set {state.id} takes new jobs again", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "accountant":  # its own parser; the client's is not built
        return _accountant(argv)
    from dprc.client import commands as client_commands

    if argv and argv[0] in client_commands.CLIENT_COMMANDS:
        return _run_client(build_client_parser(), argv)
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
