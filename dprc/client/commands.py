"""The client's sub-commands: ``dprc login``, ``dprc files …``, ``dprc jobs …``,
``dprc audit …``, ``dprc chat`` / ``dprc complete`` (:mod:`dprc.client.chat`) and
``dprc synthetic …`` (:mod:`dprc.client.synthetic`).

Every command takes ``--server URL`` (else ``DPRC_SERVER_URL`` or the client config, see
:mod:`dprc.client.config`) and ``--json`` (the server's objects as JSON, for scripts; tables
otherwise). Errors are one line on stderr and exit status 2; ``jobs get --follow`` exits with
the job's outcome (:mod:`dprc.client.follow`).
"""

from __future__ import annotations

import argparse
import getpass
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

from dprc.client import audit_chain
from dprc.client import chat as chat_mod
from dprc.client import follow as follow_mod
from dprc.client import synthetic as synthetic_mod
from dprc.client.api import Client, ClientError
from dprc.client.config import load_config, save_config
from dprc.client.tables import fields, number, table, when

CLIENT_COMMANDS = ("login", "files", "jobs", "audit", *chat_mod.COMMANDS, *synthetic_mod.COMMANDS)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server", metavar="URL", help="server URL (default: DPRC_SERVER_URL or the client config)"
    )
    common.add_argument("--json", action="store_true", help="print the server's JSON")
    return common


def add_subparsers(sub: Any) -> None:
    """Register ``login``, ``files``, ``jobs``, ``audit``, ``chat`` and ``complete`` on the
    ``dprc`` command's sub-parsers."""
    common = _common()
    login = sub.add_parser(
        "login",
        help="save the server URL and an API key (read from stdin) in the client config",
    )
    login.add_argument("--server", metavar="URL", required=True)
    login.set_defaults(func=_login)
    _add_files(sub, common)
    _add_jobs(sub, common)
    _add_audit(sub, common)
    chat_mod.add_subparsers(sub, common)
    synthetic_mod.add_subparsers(sub, common)


def _add_files(sub: Any, common: argparse.ArgumentParser) -> None:
    files = sub.add_parser("files", help="data sets and result files on a dprc server")
    fsub = files.add_subparsers(dest="files_command", required=True)
    up = fsub.add_parser("upload", parents=[common], help="upload a JSONL data set")
    up.add_argument("path", type=Path)
    up.add_argument("--purpose", default="fine-tune")
    up.add_argument("--epsilon-budget", type=float, help="privacy budget of the data set")
    up.add_argument("--delta", type=float, help="δ of the budget (default: 1/N^1.1)")
    up.add_argument(
        "--unbudgeted",
        action="store_true",
        help="validation-only data without a budget (no job may train on it)",
    )
    up.add_argument(
        "--user-field",
        help="user-level DP: the field naming each line's user (every line must have it; "
        "without it, lines may name their users in user_id); the budget is then per user",
    )
    up.set_defaults(func=_files_upload)
    ls = fsub.add_parser("list", parents=[common], help="list files")
    ls.add_argument("--purpose")
    ls.set_defaults(func=_files_list)
    for name, func, text in (
        ("get", _files_get, "show a file"),
        ("delete", _files_delete, "delete a file"),
    ):
        p = fsub.add_parser(name, parents=[common], help=text)
        p.add_argument("file_id")
        p.set_defaults(func=func)
    bud = fsub.add_parser(
        "budget", parents=[common], help="show a data set's budget, or change it (admins)"
    )
    bud.add_argument("file_id")
    bud.add_argument("--set", type=float, dest="epsilon", metavar="EPSILON")
    bud.add_argument("--delta", type=float)
    bud.add_argument("--reason", help="why the budget changes (required with --set / --delta)")
    bud.set_defaults(func=_files_budget)
    pending = fsub.add_parser(
        "pending", parents=[common], help="uploads waiting for a data owner's approval"
    )
    pending.set_defaults(func=_files_pending)
    appr = fsub.add_parser(
        "approve",
        parents=[common],
        help="approve a pending upload (data owners): a new budget, or --join a budget group",
    )
    appr.add_argument("file_id")
    how = appr.add_mutually_exclusive_group(required=True)
    how.add_argument("--epsilon-budget", type=float, help="the new data set's budget")
    how.add_argument("--join", metavar="BUDGET_GROUP", help="join this budget group (bg-…)")
    appr.add_argument("--delta", type=float, help="δ of the new budget (default: 1/N^1.1)")
    appr.add_argument(
        "--unit", choices=["example", "user"], help="confirm the privacy unit (the upload's own)"
    )
    appr.add_argument("--reason", required=True, help="why (kept in the audit log)")
    appr.set_defaults(func=_files_approve)
    rej = fsub.add_parser(
        "reject", parents=[common], help="reject a pending upload: its content is deleted"
    )
    rej.add_argument("file_id")
    rej.add_argument("--reason", required=True, help="why (kept in the audit log)")
    rej.set_defaults(func=_files_reject)
    dl = fsub.add_parser("download", parents=[common], help="download a file's content")
    dl.add_argument("file_id")
    dl.add_argument("-o", "--output", help="path (default: the file's name; - for stdout)")
    dl.set_defaults(func=_files_download)


def _add_jobs(sub: Any, common: argparse.ArgumentParser) -> None:
    jobs = sub.add_parser("jobs", help="fine-tuning jobs on a dprc server")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    create = jsub.add_parser("create", parents=[common], help="create a fine-tuning job")
    _job_arguments(create)
    create.set_defaults(func=_jobs_create)
    ls = jsub.add_parser("list", parents=[common], help="list jobs, newest first")
    ls.add_argument("--limit", type=int, default=20)
    ls.set_defaults(func=_jobs_list)
    get = jsub.add_parser("get", parents=[common], help="show a job (--follow: live)")
    get.add_argument("job_id")
    _follow_arguments(get)
    get.set_defaults(func=_jobs_get)
    ev = jsub.add_parser("events", parents=[common], help="a job's events, oldest first")
    ev.add_argument("job_id")
    ev.add_argument("--limit", type=int, default=100)
    ev.set_defaults(func=_jobs_events)
    for name, func, text in (
        ("checkpoints", _jobs_checkpoints, "a job's checkpoints and their metrics"),
        ("ledger", _jobs_ledger, "a job's privacy ledger"),
        ("cancel", _jobs_move, "cancel a job"),
        ("pause", _jobs_move, "pause a job (it stops at a checkpoint)"),
        ("resume", _jobs_move, "resume a paused job"),
    ):
        p = jsub.add_parser(name, parents=[common], help=text)
        p.add_argument("job_id")
        p.set_defaults(func=func, move=name)
    dl = jsub.add_parser(
        "download", parents=[common], help="download a checkpoint archive or the results CSV"
    )
    dl.add_argument("job_id")
    which = dl.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="the checkpoint at this step (default: last)")
    which.add_argument("--results", action="store_true", help="the results CSV")
    dl.add_argument("-o", "--output", help="path (default: <job>-step-N.tar or -results.csv)")
    dl.add_argument("--extract", type=Path, metavar="DIR", help="extract the archive here")
    dl.set_defaults(func=_jobs_download)


def _add_audit(sub: Any, common: argparse.ArgumentParser) -> None:
    audit = sub.add_parser("audit", help="the tenant's audit log (admin keys)")
    asub = audit.add_subparsers(dest="audit_command", required=True)
    ls = asub.add_parser("list", parents=[common], help="list entries, oldest first")
    ls.add_argument("--action", help="e.g. key.create, job.cancel")
    ls.add_argument("--key-id", help="the key that acted")
    ls.add_argument("--resource", help="the id of what was acted on")
    ls.set_defaults(func=_audit_list)
    server_only = argparse.ArgumentParser(add_help=False)
    server_only.add_argument("--server", metavar="URL", help="server URL")
    verify = asub.add_parser(
        "verify",
        parents=[server_only],
        help="fetch the whole log and recompute its hash chain here (exit 1 if broken)",
    )
    verify.set_defaults(func=_audit_verify)


def _job_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="an allow-listed model (see GET /v1/models)")
    p.add_argument("--training-file", help="file id")
    p.add_argument("--validation-file", help="file id: valid_loss at every checkpoint")
    p.add_argument(
        "--body",
        type=Path,
        help="a JSON file with the whole request (the options here override its fields)",
    )
    hp = p.add_argument_group("hyperparameters")
    hp.add_argument("--epochs", type=int, dest="n_epochs")
    hp.add_argument("--batch-size", type=int, help="expected Poisson batch size")
    hp.add_argument("--learning-rate", type=float)
    hp.add_argument("--learning-rate-multiplier", type=float)
    hp.add_argument("--max-seq-len", type=int)
    hp.add_argument(
        "--method",
        choices=("supervised", "dpo"),
        help="supervised (the default) or dpo: preference optimisation on a file of "
        "preference lines, one pair the privacy unit (docs/data.md)",
    )
    hp.add_argument("--beta", type=float, help="dpo: DPO's beta (default 0.1)")
    priv = p.add_argument_group("privacy")
    priv.add_argument("--target-epsilon", type=float)
    priv.add_argument("--target-delta", type=float)
    priv.add_argument("--max-grad-norm", type=float)
    priv.add_argument("--norm-method", help="exact | hutch | hutchpp | auto")
    priv.add_argument("--k", type=int, help="projection dimension (randomized methods)")
    priv.add_argument(
        "--sketch",
        choices=("shared", "per_example"),
        help="randomized methods' projections: per example (the default for randomized "
        "methods; hidden-scale accounting: less noise for the same epsilon) or shared by the "
        "batch",
    )
    priv.add_argument(
        "--privacy-unit",
        choices=("example", "user"),
        help="what epsilon protects: one example, or one user with all their lines (the "
        "training file's lines name their users; docs/privacy_unit.md)",
    )
    priv.add_argument(
        "--max-examples-per-user",
        type=int,
        help="user level: the most lines a sampled user contributes a step (default 8)",
    )
    priv.add_argument(
        "--no-train-loss",
        action="store_true",
        help="report_train_loss: false (training loss is not covered by DP)",
    )
    dev = p.add_argument_group("devices")
    dev.add_argument(
        "--devices",
        type=int,
        help="devices of each host the job trains on (default 1; data-parallel ranks)",
    )
    dev.add_argument(
        "--nodes",
        type=int,
        help="hosts the job trains on (default 1): nodes × devices ranks, launched through "
        "Ray (a service with DPRC_LAUNCHER=ray); the privacy plan is the same",
    )
    dev.add_argument(
        "--sharding",
        choices=("none", "fsdp"),
        help="how the ranks hold the model: none (the whole model on each, the default) or "
        "fsdp (FSDP2: each holds 1/devices of the parameters, gradients and optimizer state; "
        "needs --devices 2 or more and Gaussian noise)",
    )
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--seed", type=int, help="keep a chosen seed as secret as the data")
    p.add_argument("--suffix")
    p.add_argument("--idempotency-key", help="default: a fresh one (safe retries)")
    _follow_arguments(p)


def _follow_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--follow", action="store_true", help="follow the job until it ends")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--timeout", type=float, help="stop following after this many seconds")


# -- helpers ----------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    return Client(load_config(args.server))


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _budget(f: dict[str, Any]) -> str:
    b = f.get("budget")
    if not b:
        return "-"
    per = " per user" if b.get("unit") == "user" else ""
    return f"ε {number(b['epsilon'])}{per} (remaining {number(b['remaining'])})"


FILE_COLUMNS = [
    ("ID", lambda f: f["id"]),
    ("FILENAME", lambda f: f["filename"]),
    ("PURPOSE", lambda f: f["purpose"]),
    ("EXAMPLES", lambda f: f.get("n_examples")),
    ("USERS", lambda f: f.get("n_users")),
    ("FORMAT", lambda f: f.get("format")),
    ("BUDGET", _budget),
    ("APPROVAL", lambda f: (f.get("approval") or {}).get("status", "approved")),
    ("CREATED", lambda f: when(f["created_at"])),
]


def _overlap_words(f: dict[str, Any]) -> str:
    """A pending upload's overlap report in a line: the groups it shares examples with."""
    report = (f.get("approval") or {}).get("report") or {}
    groups = report.get("groups") or []
    if not groups:
        return "shares no example with a budget group"
    parts = []
    for g in groups:
        words = f"{g['shared_examples']} with {g['budget_group']}"
        if g.get("near_duplicates"):
            words += f" (+{g['near_duplicates']} near copies)"
        if g.get("shared_users"):
            words += f" ({g['shared_users']} of its users)"
        parts.append(words)
    return "shares " + ", ".join(parts)


PENDING_COLUMNS = [
    ("ID", lambda f: f["id"]),
    ("FILENAME", lambda f: f["filename"]),
    ("EXAMPLES", lambda f: f.get("n_examples")),
    ("USERS", lambda f: f.get("n_users")),
    ("ASKED", lambda f: ((f.get("approval") or {}).get("requested_budget") or {}).get("epsilon")),
    ("BY", lambda f: f.get("created_by")),
    ("OVERLAP", _overlap_words),
]
JOB_COLUMNS = [
    ("ID", lambda j: j["id"]),
    ("STATUS", lambda j: j["status"]),
    ("MODEL", lambda j: j["model"]),
    ("STEP", lambda j: f"{j['steps_done']}/{j['steps_total']}"),
    ("EPSILON", lambda j: j["privacy"].get("epsilon_spent")),
    ("TARGET", lambda j: j["privacy"].get("target_epsilon")),
    ("CREATED", lambda j: when(j["created_at"])),
]


def _show_file(f: dict[str, Any]) -> None:
    print(table([f], FILE_COLUMNS))
    for warning in (f.get("budget") or {}).get("warnings") or []:  # e.g. delta_large
        print(f"warning: {warning['code']}: {warning['message']}")
    if (f.get("approval") or {}).get("status") == "pending":
        print(f"pending a data owner's approval: {_overlap_words(f)}")


# -- login and files --------------------------------------------------------------------------


def _login(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        key = getpass.getpass("API key: ")
    else:
        key = sys.stdin.readline()
    if not key.strip():
        raise ValueError("no API key given on stdin")
    path = save_config(args.server, key)
    print(f"saved the server URL and key in {path} (mode 0600)", file=sys.stderr)
    return 0


def _files_upload(args: argparse.Namespace) -> int:
    f = _client(args).upload(
        args.path, args.purpose, args.epsilon_budget, args.delta, args.unbudgeted, args.user_field
    )
    _print_json(f) if args.json else _show_file(f)
    return 0


def _files_list(args: argparse.Namespace) -> int:
    data = _client(args).list_files(args.purpose)
    _print_json(data) if args.json else print(table(data, FILE_COLUMNS))
    return 0


def _files_get(args: argparse.Namespace) -> int:
    f = _client(args).get_file(args.file_id)
    _print_json(f) if args.json else _show_file(f)
    return 0


def _files_pending(args: argparse.Namespace) -> int:
    data = _client(args).list_files(approval="pending")
    _print_json(data) if args.json else print(table(data, PENDING_COLUMNS))
    return 0


def _files_approve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"reason": args.reason}
    if args.join is not None:
        if args.delta is not None:
            raise ValueError(
                "--delta goes with --epsilon-budget: a joined upload takes the group's"
            )
        body["budget_group"] = args.join
    else:
        body["epsilon_budget"] = args.epsilon_budget
        if args.delta is not None:
            body["delta"] = args.delta
    if args.unit is not None:
        body["unit"] = args.unit
    f = _client(args).approve(args.file_id, body)
    _print_json(f) if args.json else _show_file(f)
    return 0


def _files_reject(args: argparse.Namespace) -> int:
    f = _client(args).reject(args.file_id, args.reason)
    _print_json(f) if args.json else print(f"rejected {f['id']}: its content is deleted")
    return 0


def _files_delete(args: argparse.Namespace) -> int:
    out = _client(args).delete_file(args.file_id)
    _print_json(out) if args.json else print(f"deleted {out['id']}")
    return 0


def _files_budget(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.epsilon is not None or args.delta is not None:
        if not args.reason:
            raise ValueError("a budget change needs --reason")
        f = client.set_budget(args.file_id, args.epsilon, args.delta, args.reason)
    else:
        f = client.get_file(args.file_id)
    budget = f.get("budget")
    if args.json:
        _print_json(budget)
    elif budget is None:
        print(f"file {f['id']} has no privacy budget")
    else:
        names = ["epsilon", "delta", "spent", "reserved", "committed", "remaining"]
        print(fields(budget, names))
    return 0


def _write(data: bytes, output: str) -> None:
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    Path(output).write_bytes(data)
    print(f"wrote {output} ({len(data)} bytes)", file=sys.stderr)


def _files_download(args: argparse.Namespace) -> int:
    client = _client(args)
    output = args.output or Path(client.get_file(args.file_id)["filename"]).name
    _write(client.file_content(args.file_id), output)
    return 0


# -- jobs -------------------------------------------------------------------------------------


def job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The create request: ``--body`` (if given) with the options set on top."""
    body: dict[str, Any] = {}
    if args.body is not None:
        try:
            body = json.loads(args.body.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read --body {args.body}: {exc}") from exc
        if not isinstance(body, dict):
            raise ValueError(f"--body {args.body} must hold a JSON object")
    for name in (
        "model",
        "training_file",
        "validation_file",
        "checkpoint_every",
        "seed",
        "suffix",
        "devices",
        "nodes",
        "sharding",
    ):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    hp = body.setdefault("hyperparameters", {})
    for name in ("n_epochs", "batch_size", "learning_rate", "learning_rate_multiplier"):
        if getattr(args, name) is not None:
            hp[name] = getattr(args, name)
    if args.max_seq_len is not None:
        hp["max_seq_len"] = args.max_seq_len
    priv = body.setdefault("privacy", {})
    for name in ("target_epsilon", "target_delta", "max_grad_norm"):
        if getattr(args, name) is not None:
            priv[name] = getattr(args, name)
    if args.norm_method is not None or args.k is not None or args.sketch is not None:
        clip = priv.setdefault("clipping", {})
        if args.norm_method is not None:
            clip["method"] = args.norm_method
        if args.k is not None:
            clip["k"] = args.k
        if args.sketch is not None:
            clip["sketch"] = args.sketch
    if args.no_train_loss:
        priv["report_train_loss"] = False
    if args.privacy_unit is not None or args.max_examples_per_user is not None:
        unit = priv.setdefault("unit", {})
        if isinstance(unit, str):
            unit = priv["unit"] = {"type": unit}
        unit["type"] = args.privacy_unit or unit.get("type", "user")
        if args.max_examples_per_user is not None:
            unit["max_examples_per_user"] = args.max_examples_per_user
    _method(body, args.method, args.beta)
    missing = [
        flag
        for flag, have in (
            ("--model", "model" in body),
            ("--training-file", "training_file" in body),
            ("--target-epsilon", "target_epsilon" in priv),
        )
        if not have
    ]
    if missing:
        raise ValueError(f"jobs create needs {', '.join(missing)} (or them in --body)")
    return body


def _method(body: dict[str, Any], kind: str | None, beta: float | None) -> None:
    """OpenAI's ``method`` in ``body``: the one ``--method`` names (or ``--body`` holds), with
    the hyperparameters moved into it (the API takes them in one place) and ``--beta``."""
    method = body.get("method")
    if kind is None and beta is not None:
        kind = method.get("type") if isinstance(method, dict) else "dpo"
    if beta is not None and kind != "dpo":
        raise ValueError("--beta is DPO's: give it with --method dpo")
    if kind is not None and not (isinstance(method, dict) and method.get("type") == kind):
        method = body["method"] = {"type": kind}
    if not isinstance(method, dict) or method.get("type") not in ("supervised", "dpo"):
        return
    kind = str(method["type"])
    inner = method.setdefault(kind, {}).setdefault("hyperparameters", {})
    inner.update(body.pop("hyperparameters", {}))
    if beta is not None:
        inner["beta"] = beta


def _method_words(job: dict[str, Any]) -> str:
    method = job.get("method") or {"type": "supervised"}
    kind = method.get("type", "supervised")
    if kind != "dpo":
        return str(kind)
    beta = ((method.get("dpo") or {}).get("hyperparameters") or {}).get("beta")
    return f"dpo (beta {number(beta)}; one preference pair is one example)"


def _show_job(job: dict[str, Any]) -> None:
    p = job["privacy"]
    flat = {
        "id": job["id"],
        "status": job["status"],
        "model": job["model"],
        "training_file": job["training_file"],
        "validation_file": job.get("validation_file"),
        "method": _method_words(job),
        "steps": f"{job['steps_done']}/{job['steps_total']}",
        "epsilon_spent": p.get("epsilon_spent"),
        "planned_epsilon": p.get("planned_epsilon"),
        "target": f"ε {number(p.get('target_epsilon'))} at δ {number(p.get('target_delta'))}",
        "noise_multiplier": p.get("noise_multiplier"),
        "sample_rate": p.get("sample_rate"),
        "devices": _devices_words(job),
        "privacy_unit": _unit_words(p.get("unit") or {}),
        "accounted_as": _accounted_as(p.get("accountant") or {}),
        "result_files": ", ".join(job.get("result_files") or []) or None,
        "fine_tuned_model": job.get("fine_tuned_model"),
        "created": when(job["created_at"]),
        "finished": when(job.get("finished_at")),
    }
    for i, warning in enumerate(p.get("warnings") or []):  # e.g. delta_large (docs/api.md)
        flat[f"warning{i + 1 if i else ''}"] = f"{warning.get('code')}: {warning.get('message')}"
    err = job.get("error")
    if err:
        flat["error"] = f"{err.get('code')}: {err.get('message')}"
    print(fields(flat, list(flat)))


def _devices_words(job: dict[str, Any]) -> str:
    """How many devices (of how many hosts) a job trains on and how its ranks hold the model,
    in words (the dashboard's: api/dashboard/static/job.js, devicesWords)."""
    n, m = int(job.get("devices") or 1), int(job.get("nodes") or 1)
    ranks = n * m
    if ranks <= 1:
        return "1 device"
    where = f"{n} devices" if m <= 1 else f"{m} nodes × {n} device(s) ({ranks} ranks)"
    if job.get("sharding") == "fsdp":
        return f"{where}, model sharded (FSDP): 1/{ranks} of it on each"
    return f"{where}, data-parallel (whole model on each)"


def _unit_words(unit: dict[str, Any]) -> str:
    """What a job's ε protects (``privacy.unit``), in words."""
    if unit.get("type") != "user":
        return "example (ε per line)"
    return (
        f"user (ε per user; {unit.get('n_users')} users in {unit.get('field')!r}, at most "
        f"{unit.get('max_examples_per_user')} lines a user a step)"
    )


def _accounted_as(acc: dict[str, Any]) -> str | None:
    """The accountant's clipping, k and sketch of a job (``privacy.accountant``)."""
    if not acc.get("clipping"):
        return None
    text = str(acc["clipping"]) + (f", k={acc['k']}" if acc.get("k") else "")
    if acc["clipping"] != "exact":
        text += f", {str(acc.get('sketch') or 'shared').replace('_', '-')} sketch"
    return text


def _jobs_create(args: argparse.Namespace) -> int:
    client = _client(args)
    job = client.create_job(job_body(args), args.idempotency_key)
    if args.follow:
        if not args.json:
            print(f"created {job['id']}", file=sys.stderr)
        return follow_mod.follow(client, job["id"], args.json, args.interval, args.timeout)
    _print_json(job) if args.json else _show_job(job)
    return 0


def _jobs_list(args: argparse.Namespace) -> int:
    page = _client(args).list_jobs(args.limit)
    _print_json(page["data"]) if args.json else print(table(page["data"], JOB_COLUMNS))
    return 0


def _jobs_get(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        return follow_mod.follow(client, args.job_id, args.json, args.interval, args.timeout)
    job = client.get_job(args.job_id)
    _print_json(job) if args.json else _show_job(job)
    return 0


def _jobs_events(args: argparse.Namespace) -> int:
    data = list(reversed(_client(args).events(args.job_id, limit=args.limit)["data"]))
    if args.json:
        _print_json(data)
        return 0
    for e in data:
        extra = ""
        if e.get("data") and e.get("type") == "metrics":
            extra = "  " + " ".join(f"{k}={number(v)}" for k, v in e["data"].items())
        print(f"{when(e['created_at'])}  {e['level']:<5}  {e['message']}{extra}")
    return 0


def _jobs_checkpoints(args: argparse.Namespace) -> int:
    data = sorted(_client(args).checkpoints(args.job_id), key=lambda c: c["step_number"])
    if args.json:
        _print_json(data)
        return 0
    columns = [
        ("STEP", lambda c: c["step_number"]),
        ("EPSILON", lambda c: c["epsilon"]),
        ("TRAIN_LOSS", lambda c: c["metrics"].get("train_loss")),
        ("VALID_LOSS", lambda c: c["metrics"].get("valid_loss")),
        ("FILE", lambda c: c["file_id"]),
        ("CHECKPOINT", lambda c: c["id"]),
    ]
    print(table(data, columns))
    return 0


def _getter(key: str) -> Any:
    return lambda row: row.get(key)


def _jobs_ledger(args: argparse.Namespace) -> int:
    led = _client(args).ledger(args.job_id)
    if args.json:
        _print_json(led)
        return 0
    print(f"epsilon spent {number(led['epsilon_spent'], 6)} at delta {number(led['delta'])}")
    rows = led["ledger"].get("events", [])
    if rows:
        keys = [k for k in rows[0] if k not in ("format",)]
        print(table(rows, [(k.upper(), _getter(k)) for k in keys]))
    planned = led["planned"]
    print("planned: " + ", ".join(f"{k}={number(v)}" for k, v in planned.items()))
    return 0


def _jobs_move(args: argparse.Namespace) -> int:
    client = _client(args)
    job = getattr(client, args.move)(args.job_id)
    if args.json:
        _print_json(job)
    else:
        pending = (
            " (requested: the worker stops after its step)"
            if (job.get("cancel_requested") or job.get("pause_requested"))
            and job["status"] == "running"
            else ""
        )
        print(f"{job['id']}: {job['status']}{pending}")
    return 0


def _results_file(client: Client, job: dict[str, Any]) -> dict[str, Any]:
    for file_id in reversed(job.get("result_files") or []):
        f = client.get_file(file_id)
        if f["filename"].endswith("-results.csv"):
            return f
    raise ClientError(f"job {job['id']} has no results file yet (it is written when it ends)")


def _jobs_download(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.results:
        if args.extract is not None:
            raise ValueError("--extract is for checkpoint archives")
        f = _results_file(client, client.get_job(args.job_id))
        _write(client.file_content(f["id"]), args.output or f["filename"])
        return 0
    ckpts = client.checkpoints(args.job_id)
    if not ckpts:
        raise ClientError(f"job {args.job_id} has no checkpoint yet")
    if args.step is None:
        ckpt = max(ckpts, key=lambda c: c["step_number"])
    else:
        found = [c for c in ckpts if c["step_number"] == args.step]
        if not found:
            steps = sorted(c["step_number"] for c in ckpts)
            raise ClientError(f"job {args.job_id} has no checkpoint at step {args.step} ({steps})")
        ckpt = found[0]
    data = client.file_content(ckpt["file_id"])
    if args.extract is not None:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(args.extract, filter="data")  # no links out, no absolute paths
        print(f"extracted step {ckpt['step_number']} into {args.extract}", file=sys.stderr)
        if args.output is None:
            return 0
    _write(data, args.output or f"{args.job_id}-step-{ckpt['step_number']}.tar")
    return 0


# -- audit ------------------------------------------------------------------------------------


AUDIT_COLUMNS = [
    ("ID", lambda e: e["id"]),
    ("TIME", lambda e: when(e["created_at"])),
    ("ACTION", lambda e: e["action"]),
    ("RESOURCE", lambda e: e.get("resource")),
    ("KEY", lambda e: e.get("key_id") or "(shell)"),
    ("ROLE", lambda e: e.get("role")),
    ("REQUEST", lambda e: e.get("request_id")),
    ("DETAIL", lambda e: json.dumps(e.get("detail") or {}, sort_keys=True, ensure_ascii=False)),
]


def _audit_list(args: argparse.Namespace) -> int:
    filters = {"action": args.action, "key_id": args.key_id, "resource": args.resource}
    data = _client(args).all_audit_logs(filters)
    _print_json(data) if args.json else print(table(data, AUDIT_COLUMNS))
    return 0


def _audit_verify(args: argparse.Namespace) -> int:
    """Exit 0 when the chain holds, 1 naming the first entry that breaks it."""
    verdict = audit_chain.verify(_client(args).all_audit_logs())
    print(verdict.line())
    return 0 if verdict.ok else 1
