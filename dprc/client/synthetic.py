"""``dprc synthetic …``: synthetic-data jobs on a dprc server (``/v1/synthetic_data/jobs``,
docs/synthetic.md, "The service"; docs/cli.md, "Synthetic data").

``create`` (from one of the tenant's ``ft:`` models, or from a training file with the
fine-tuning job created first), ``list``, ``get [--follow]``, ``events``, ``cancel`` and
``report`` (the owner's report: not differentially private, admin and data_owner keys only).
Every command takes ``--server`` and ``--json``, as the other client commands; errors are one
line on stderr and exit status 2; ``get --follow`` exits with the job's outcome (0 succeeded,
1 failed or cancelled, 4 still running after ``--timeout``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dprc.client.api import Client, ClientError
from dprc.client.config import load_config
from dprc.client.tables import fields, number, table, when

COMMANDS = ("synthetic",)
BASE = "/synthetic_data/jobs"
TERMINAL = {"succeeded": 0, "failed": 1, "cancelled": 1}
REPORT_NOTE = (
    "the owner's report reads the private data: it is NOT differentially private; only admin "
    "and data_owner keys read it, keep it to them"
)


def add_subparsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``synthetic`` (``common``: ``--server`` and ``--json``)."""
    syn = sub.add_parser("synthetic", help="synthetic-data jobs on a dprc server")
    ssub = syn.add_subparsers(dest="synthetic_command", required=True)

    create = ssub.add_parser(
        "create",
        parents=[common],
        help="create a synthetic-data job (from an ft: model, or from a training file)",
        description="Generate N records from one of your ft: models (--model), or fine-tune "
        "a base model on a training file first (--training-file, --base-model, --epsilon).",
    )
    create.add_argument("--n", type=int, required=True, help="records to generate")
    create.add_argument("--model", metavar="FT_MODEL", help="an ft: model that generates")
    create.add_argument("--training-file", metavar="FILE", help="a fine-tune data set's id")
    ft = create.add_argument_group("fine-tuning (with --training-file)")
    ft.add_argument("--base-model", metavar="MODEL", help="the causal LM to fine-tune")
    ft.add_argument("--epsilon", type=float, help="the fine-tuning job's target ε")
    ft.add_argument("--delta", type=float, help="its target δ (default: the server's)")
    ft.add_argument("--n-epochs", type=int)
    ft.add_argument("--batch-size", type=int, help="expected Poisson batch size")
    ft.add_argument("--learning-rate", type=float)
    ft.add_argument("--max-seq-len", type=int)
    ft.add_argument("--norm-method", help="exact | hutch | hutchpp | auto")
    lab = create.add_argument_group("labels (classification)")
    which = lab.add_mutually_exclusive_group()
    which.add_argument(
        "--labels",
        choices=("dp", "uniform"),
        help="dp (default: a label histogram released under DP, charged to the data set) or "
        "uniform",
    )
    which.add_argument(
        "--label-weights", metavar="JSON", help='public weights, e.g. \'{"calm": 2, "angry": 1}\''
    )
    lab.add_argument("--label-epsilon", type=float, help="the histogram's own ε")
    gen = create.add_argument_group("generation")
    gen.add_argument(
        "--prompts-file",
        type=Path,
        metavar="JSONL",
        help='chat: public prompts, one {"messages": [...]} a line',
    )
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--max-tokens", type=int, help="tokens a record at most")
    gen.add_argument("--seed", type=int)
    create.add_argument(
        "--holdout-file", metavar="FILE", help="held-out real records for the owner's report"
    )
    _follow_arguments(create)
    create.set_defaults(func=_create)

    ls = ssub.add_parser("list", parents=[common], help="list synthetic-data jobs, newest first")
    ls.add_argument("--limit", type=int, default=20)
    ls.add_argument("--after", metavar="ID", help="the jobs after this one")
    ls.set_defaults(func=_list)

    get = ssub.add_parser("get", parents=[common], help="show a job (--follow: until it ends)")
    get.add_argument("job_id")
    _follow_arguments(get)
    get.set_defaults(func=_get)

    ev = ssub.add_parser("events", parents=[common], help="a job's events, oldest first")
    ev.add_argument("job_id")
    ev.set_defaults(func=_events)

    cancel = ssub.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("job_id")
    cancel.set_defaults(func=_cancel)

    rep = ssub.add_parser(
        "report",
        parents=[common],
        help="the owner's report as JSON (not differentially private; admin and data_owner "
        "keys only)",
    )
    rep.add_argument("job_id")
    rep.add_argument("-o", "--output", type=Path, metavar="FILE", help="write it here")
    rep.set_defaults(func=_report)


def _follow_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--follow", action="store_true", help="follow the job until it ends")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--timeout", type=float, help="stop following after this many seconds")


# -- requests ---------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    return Client(load_config(args.server))


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _retrieve(client: Client, job_id: str) -> dict[str, Any]:
    return client._get(f"{BASE}/{job_id}")  # noqa: SLF001  (the client's raw request)


def synthetic_body(args: argparse.Namespace) -> dict[str, Any]:
    """The create request from the options (ValueError: a usage error, exit status 2)."""
    if (args.model is None) == (args.training_file is None):
        raise ValueError(
            "synthetic create needs exactly one of --model FT_MODEL (an ft: model) or "
            "--training-file FILE (with --base-model and --epsilon)"
        )
    body: dict[str, Any] = {"n": args.n}
    ft_given = [
        flag
        for flag, name in (
            ("--base-model", "base_model"),
            ("--epsilon", "epsilon"),
            ("--delta", "delta"),
            ("--n-epochs", "n_epochs"),
            ("--batch-size", "batch_size"),
            ("--learning-rate", "learning_rate"),
            ("--max-seq-len", "max_seq_len"),
            ("--norm-method", "norm_method"),
        )
        if getattr(args, name) is not None
    ]
    if args.model is not None:
        if ft_given:
            raise ValueError(f"{', '.join(ft_given)} go with --training-file, not --model")
        body["model"] = args.model
    else:
        missing = [
            flag
            for flag, name in (("--base-model", "base_model"), ("--epsilon", "epsilon"))
            if getattr(args, name) is None
        ]
        if missing:
            raise ValueError(f"--training-file needs {' and '.join(missing)}")
        body["training_file"] = args.training_file
        hp = {
            name: getattr(args, name)
            for name in ("n_epochs", "batch_size", "learning_rate", "max_seq_len")
            if getattr(args, name) is not None
        }
        privacy: dict[str, Any] = {"target_epsilon": args.epsilon}
        if args.delta is not None:
            privacy["target_delta"] = args.delta
        if args.norm_method is not None:
            privacy["clipping"] = {"method": args.norm_method}
        body["fine_tuning"] = {"model": args.base_model, "hyperparameters": hp, "privacy": privacy}
    if args.label_weights is not None:
        try:
            weights = json.loads(args.label_weights)
        except ValueError as exc:
            raise ValueError(f"--label-weights is not JSON: {exc}") from None
        if not isinstance(weights, dict) or not weights:
            raise ValueError('--label-weights must be a JSON object, e.g. {"a": 1, "b": 2}')
        body["labels"] = weights
    elif args.labels is not None:
        body["labels"] = args.labels
    if args.label_epsilon is not None:
        body["label_epsilon"] = args.label_epsilon
    if args.prompts_file is not None:
        body["prompts"] = read_prompts(args.prompts_file)
    sampling = {
        name: getattr(args, name)
        for name in ("temperature", "top_p", "max_tokens")
        if getattr(args, name) is not None
    }
    if sampling:
        body["sampling"] = sampling
    if args.seed is not None:
        body["seed"] = args.seed
    if args.holdout_file is not None:
        body["holdout_file"] = args.holdout_file
    return body


def read_prompts(path: Path) -> list[list[dict[str, Any]]]:
    """The message lists of a JSONL file: one ``{"messages": [...]}`` a line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read --prompts-file {path}: {exc}") from None
    prompts = []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{path}:{i}: not JSON: {exc}") from None
        messages = line.get("messages") if isinstance(line, dict) else None
        if not isinstance(messages, list) or not messages:
            raise ValueError(f'{path}:{i}: expected {{"messages": [...]}}')
        prompts.append(messages)
    if not prompts:
        raise ValueError(f"--prompts-file {path} holds no prompt")
    return prompts


# -- words ------------------------------------------------------------------------------------


def epsilon_words(job: dict[str, Any]) -> str:
    """The one (ε, δ) of the job, its unit and what it composes."""
    p = job["privacy"]
    eps = p.get("epsilon")
    e = "∞ (no finite bound)" if eps is None else number(float(eps))
    unit = "user" if p.get("privacy_unit") == "user" else "example"
    if (job.get("labels") or {}).get("type") == "dp":
        composed = "composed: fine-tuning + label histogram"
    else:
        composed = "the fine-tuning's alone: no label histogram"
    return f"ε = {e} at δ = {number(p.get('delta'))} for each {unit} ({composed})"


def _labels_words(labels: dict[str, Any]) -> str:
    kind = labels.get("type")
    if kind == "dp":
        parts = [f"ε {number(labels.get('epsilon'))}"]
        if labels.get("noise_multiplier") is not None:
            parts.append(f"σ {number(labels['noise_multiplier'])}")
        return f"dp (a label histogram released under DP: {', '.join(parts)})"
    return str(kind) if kind else "-"


def show(job: dict[str, Any]) -> None:
    flat: dict[str, Any] = {
        "id": job["id"],
        "status": job["status"],
        "records": f"{job['records_done']}/{job['n']}",
        "format": job.get("format"),
        "model": job.get("model") or "(training)",
        "fine_tuning_job": f"{job['fine_tuning_job']} ({job.get('fine_tuning_status')})",
        "training_file": job.get("training_file"),
        "holdout_file": job.get("holdout_file"),
        "labels": _labels_words(job.get("labels") or {}),
        "privacy": epsilon_words(job),
        "budget_group": job["privacy"].get("budget_group"),
        "result_file": job.get("result_file"),
        "created": when(job.get("created_at")),
        "finished": when(job.get("finished_at")),
    }
    hist = job["privacy"].get("label_histogram")
    if hist:
        flat["label_histogram"] = ", ".join(
            f"{c} {number(float(n), 3)}"
            for c, n in zip(hist.get("classes") or [], hist.get("noisy_counts") or [], strict=False)
        )
    err = job.get("error")
    if err:
        flat["error"] = f"{err.get('code')}: {err.get('message')}"
    print(fields(flat, list(flat)))


COLUMNS = [
    ("ID", lambda j: j["id"]),
    ("STATUS", lambda j: j["status"]),
    ("FORMAT", lambda j: j.get("format")),
    ("RECORDS", lambda j: f"{j['records_done']}/{j['n']}"),
    ("EPSILON", lambda j: j["privacy"].get("epsilon")),
    ("DELTA", lambda j: j["privacy"].get("delta")),
    ("RESULT", lambda j: j.get("result_file")),
    ("CREATED", lambda j: when(j.get("created_at"))),
]


# -- commands ---------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    body = synthetic_body(args)
    client = _client(args)
    job = client._post(BASE, body)  # noqa: SLF001
    if args.follow:
        if not args.json:
            print(f"created {job['id']}", file=sys.stderr)
        return follow(client, job["id"], args.json, args.interval, args.timeout)
    _print_json(job) if args.json else show(job)
    return 0


def _list(args: argparse.Namespace) -> int:
    page = _client(args)._get(BASE, limit=args.limit, after=args.after)  # noqa: SLF001
    _print_json(page["data"]) if args.json else print(table(page["data"], COLUMNS))
    return 0


def _get(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        return follow(client, args.job_id, args.json, args.interval, args.timeout)
    job = _retrieve(client, args.job_id)
    _print_json(job) if args.json else show(job)
    return 0


def follow(
    client: Client, job_id: str, as_json: bool, interval: float, timeout: float | None
) -> int:
    """Poll the job until it ends: a line at each change (with ``--json``, the job object on
    one line), then the summary (without ``--json``). The exit status is the outcome's."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: tuple[Any, ...] | None = None
    while True:
        job = _retrieve(client, job_id)
        now = (job["status"], job.get("fine_tuning_status"), job["records_done"])
        if now != last:
            if as_json:
                print(json.dumps(job, sort_keys=True), flush=True)
            else:
                print(
                    f"{time.strftime('%H:%M:%S')}  {job['status']:<10}  fine-tuning "
                    f"{job.get('fine_tuning_status')}  records {job['records_done']}/{job['n']}",
                    flush=True,
                )
            last = now
        status = job["status"]
        if status in TERMINAL:
            if not as_json:
                show(job)
            if status != "succeeded":
                err = job.get("error") or {}
                why = f": {err.get('code')}: {err.get('message')}" if err else ""
                print(f"dprc: synthetic job {job_id} {status}{why}", file=sys.stderr)
            return TERMINAL[status]
        if deadline is not None and time.monotonic() > deadline:
            print(
                f"dprc: synthetic job {job_id} still {status} after {timeout:g} s", file=sys.stderr
            )
            return 4
        time.sleep(interval)


def _events(args: argparse.Namespace) -> int:
    page = _client(args)._get(f"{BASE}/{args.job_id}/events")  # noqa: SLF001
    data = list(reversed(page["data"]))  # the API lists the newest first
    if args.json:
        _print_json(data)
        return 0
    for e in data:
        print(f"{when(e['created_at'])}  {e['level']:<5}  {e['message']}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    job = _client(args)._post(f"{BASE}/{args.job_id}/cancel")  # noqa: SLF001
    _print_json(job) if args.json else print(f"{job['id']}: {job['status']}")
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        report = _client(args)._get(f"{BASE}/{args.job_id}/report")  # noqa: SLF001
    except ClientError as exc:
        if str(exc).startswith("HTTP 403"):
            raise ClientError(
                f"{exc} (the report is the data owner's: only admin and data_owner keys read "
                "it; it is not differentially private)"
            ) from None
        raise
    if not args.json:
        print(f"note: {REPORT_NOTE}", file=sys.stderr)
    text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0
