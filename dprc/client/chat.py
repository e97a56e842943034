"""``dprc chat MODEL`` and ``dprc complete MODEL [PROMPT]``: generation with an allow-listed
causal LM or one of the tenant's ``ft:`` models through ``/v1/chat/completions`` and
``/v1/completions`` (docs/cli.md, "Chat and completions").

``chat`` is interactive when stdin is a terminal and no ``-m`` is given: each line is a user
message, the answer streams to stdout as it is generated, the conversation is kept (``/reset``
forgets it, ``/exit`` or Ctrl-D ends, Ctrl-C stops an answer). Otherwise it is one request: the
``-m`` messages, or the whole of stdin as one user message. ``complete`` sends one prompt (the
argument, or stdin). Both print the text (streamed unless ``--no-stream``) followed by a
newline; ``--json`` prints the server's completion object instead. Errors are one line on
stderr and exit status 2, as the other client commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dprc.client.api import Client, ClientError
from dprc.client.config import load_config

COMMANDS = ("chat", "complete")
TIMEOUT_S = 900.0  # a long answer, not streamed, comes in one piece
HELP_LINE = "/reset forgets the conversation, /exit or Ctrl-D ends, Ctrl-C stops an answer"


def add_subparsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``chat`` and ``complete`` (``common``: ``--server`` and ``--json``)."""
    chat = sub.add_parser(
        "chat",
        parents=[common],
        help="chat with a causal LM or an ft: model (interactive on a terminal)",
        description="Chat with a model: interactive when stdin is a terminal and no -m is "
        "given (" + HELP_LINE + "); otherwise one request: the -m messages, or stdin as one "
        "user message. The answer is streamed to stdout.",
    )
    chat.add_argument("model", help="an allow-listed causal LM or one of your ft: models")
    chat.add_argument(
        "-m",
        "--message",
        action="append",
        dest="messages",
        metavar="TEXT",
        help="a user message (repeatable: several user messages, in order); no terminal "
        "session then",
    )
    chat.add_argument("--system", metavar="TEXT", help="a system message first")
    _sampling(chat)
    chat.set_defaults(func=_chat)

    comp = sub.add_parser(
        "complete",
        parents=[common],
        help="continue a prompt with a causal LM or an ft: model",
        description="Continue PROMPT (or stdin) with a model; the text is streamed to stdout.",
    )
    comp.add_argument("model", help="an allow-listed causal LM or one of your ft: models")
    comp.add_argument("prompt", nargs="?", help="the prompt (default, or -: stdin)")
    _sampling(comp)
    comp.set_defaults(func=_complete)


def _sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, metavar="N", help="new tokens at most")
    g.add_argument("--temperature", type=float, metavar="T", help="0: greedy (default 1)")
    g.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling (default 1)")
    g.add_argument("--seed", type=int, help="the same seed and request: the same answer")
    g.add_argument(
        "--stop", action="append", metavar="TEXT", help="stop before this text (repeatable)"
    )
    g.add_argument(
        "--no-stream", action="store_true", help="wait for the whole answer (no streaming)"
    )


def sampling_body(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The request's sampling fields that were given."""
    body: dict[str, Any] = {"model": args.model}
    if args.max_tokens is not None:
        body["max_completion_tokens" if kind == "chat" else "max_tokens"] = args.max_tokens
    for name in ("temperature", "top_p", "seed"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.stop:
        body["stop"] = args.stop
    return body


def _client(args: argparse.Namespace) -> Client:
    return Client(load_config(args.server), timeout=TIMEOUT_S)


def answer_text(kind: str, completion: dict[str, Any]) -> str:
    """The first choice's text of a whole completion object."""
    choices = completion.get("choices") or []
    first = next((c for c in choices if c.get("index", 0) == 0), None)
    if first is None:
        raise ClientError("the server answered no choice")
    if kind == "chat":
        return str((first.get("message") or {}).get("content") or "")
    return str(first.get("text") or "")


def _answer(client: Client, kind: str, body: dict[str, Any], args: argparse.Namespace) -> str:
    """Send ``body``; print the answer (streamed, whole, or the server's JSON) and return its
    text. A Ctrl-C while it streams closes the connection (the server stops generating)."""
    if args.json:
        completion = client.generate(kind, body)
        print(json.dumps(completion, indent=2, sort_keys=True), flush=True)
        return answer_text(kind, completion)
    if args.no_stream:
        text = answer_text(kind, client.generate(kind, body))
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return text
    pieces: list[str] = []
    stream = client.generate_stream(kind, body)
    try:
        for piece in stream:
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    finally:
        stream.close()
        if pieces:
            sys.stdout.write("\n")
            sys.stdout.flush()
    if not pieces:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return "".join(pieces)


def _read_stdin(what: str) -> str:
    text = sys.stdin.read()
    if not text.strip():
        raise ValueError(f"no {what}: stdin was empty")
    return text


def _chat(args: argparse.Namespace) -> int:
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    body = sampling_body(args, "chat")
    if args.messages is None and sys.stdin.isatty():
        return _interactive(_client(args), body, system, args)
    if args.messages is not None:
        users = args.messages
    else:
        users = [_read_stdin("message")]
    messages = [*system, *({"role": "user", "content": m} for m in users)]
    _answer(_client(args), "chat", {**body, "messages": messages}, args)
    return 0


def _interactive(
    client: Client, body: dict[str, Any], system: list[dict[str, str]], args: argparse.Namespace
) -> int:
    """A terminal session: the conversation so far goes with each new user line."""
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # pragma: no cover - not on every platform
        pass
    print(f"chatting with {args.model}: {HELP_LINE}", file=sys.stderr)
    messages = list(system)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
            print(file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = list(system)
            print("(the conversation is forgotten)", file=sys.stderr)
            continue
        if text.startswith("/") and " " not in text:
            print(f"unknown command {text}: {HELP_LINE}", file=sys.stderr)
            continue
        turn = [*messages, {"role": "user", "content": line}]
        try:
            answer = _answer(client, "chat", {**body, "messages": turn}, args)
        except KeyboardInterrupt:
            print("\n(stopped: this turn is not kept)", file=sys.stderr)
            continue
        except ClientError as exc:  # the session goes on; this turn is not kept
            print(f"dprc: error: {exc}", file=sys.stderr)
            continue
        messages = [*turn, {"role": "assistant", "content": answer}]


def _complete(args: argparse.Namespace) -> int:
    if args.prompt is None or args.prompt == "-":
        if sys.stdin.isatty():
            raise ValueError("give the PROMPT, or pipe it on stdin")
        prompt = _read_stdin("prompt")
    else:
        prompt = args.prompt
    _answer(_client(args), "complete", {**sampling_body(args, "complete"), "prompt": prompt}, args)
    return 0
