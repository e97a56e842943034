"""``dprc chat`` and ``dprc complete`` against a real server over uvicorn (SQLite, its embedded
generation engine, the built-in tiny Llama), each answer checked against the official
``openai`` client's non-streamed ``create`` for the same request (an independent path: the SDK's
typed objects, where the command reads the server's JSON or its streamed events): the text
streamed and not, the ``--json`` object with its usage, ``--system``/``--stop`` passed on, a
message piped on stdin, an unknown model in one line with exit status 2, and a terminal
session (a pseudo-terminal) that keeps the conversation and forgets it on ``/reset``."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import sys
import time
from collections.abc import Iterator

import pytest

from tests.api.conftest import Server, _serve, _settings, run_cli

TINY = "dprc-tiny-llama"
SAMPLING = ["--max-tokens", "5", "--temperature", "0"]


@pytest.fixture(scope="module")
def gen_server(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-chat-cli"), None))


@pytest.fixture(scope="module")
def key(gen_server: Server) -> str:
    return gen_server.key("chat-cli")


@pytest.fixture
def cli(gen_server: Server, key: str, monkeypatch, tmp_path):
    """``dprc ARGV --server URL`` in this process with the tenant's key: (status, out, err)."""
    monkeypatch.setenv("DPRC_API_KEY", key)
    monkeypatch.setenv("DPRC_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    monkeypatch.delenv("DPRC_SERVER_URL", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        return run_cli(*argv, "--server", gen_server.base_url)

    return run


def _ok(result: tuple[int, str, str]) -> str:
    status, out, err = result
    assert status == 0, (status, err)
    return out


def test_complete_prints_what_the_sdk_answers_streamed_or_not(gen_server, key, cli):
    want = (
        gen_server.client(key)
        .completions.create(model=TINY, prompt="abc", max_tokens=5, temperature=0)
        .choices[0]
        .text
    )
    assert _ok(cli("complete", TINY, "abc", *SAMPLING)) == want + "\n"  # streamed
    assert _ok(cli("complete", TINY, "abc", *SAMPLING, "--no-stream")) == want + "\n"


def test_chat_message_prints_what_the_sdk_answers_streamed_or_not(gen_server, key, cli):
    messages = [{"role": "user", "content": "hello there"}]
    want = (
        gen_server.client(key)
        .chat.completions.create(model=TINY, messages=messages, max_tokens=5, temperature=0)
        .choices[0]
        .message.content
    )
    assert want  # the comparison means something
    streamed = _ok(cli("chat", TINY, "-m", "hello there", *SAMPLING))
    whole = _ok(cli("chat", TINY, "-m", "hello there", *SAMPLING, "--no-stream"))
    assert streamed == whole == want + "\n"


def test_chat_system_several_messages_and_stop_are_sent(gen_server, key, cli):
    sdk = gen_server.client(key)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ]
    ask = dict(model=TINY, messages=messages, max_tokens=12, temperature=0)
    free = sdk.chat.completions.create(**ask).choices[0].message.content
    argv = ["chat", TINY, "--system", "be brief", "-m", "one", "-m", "two", "--temperature", "0"]
    assert _ok(cli(*argv, "--max-tokens", "12")) == free + "\n"
    stop = free[3:5]
    assert len(free) > 5 and stop.strip(), free
    stopped = sdk.chat.completions.create(**ask, stop=[stop]).choices[0].message.content
    assert len(stopped) < len(free)
    assert _ok(cli(*argv, "--max-tokens", "12", "--stop", stop)) == stopped + "\n"


def test_chat_reads_one_message_from_piped_stdin(gen_server, key, cli, monkeypatch):
    messages = [{"role": "user", "content": "hello there\nsecond line\n"}]
    want = (
        gen_server.client(key)
        .chat.completions.create(model=TINY, messages=messages, max_tokens=5, temperature=0)
        .choices[0]
        .message.content
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\nsecond line\n"))
    assert _ok(cli("chat", TINY, *SAMPLING)) == want + "\n"


def test_json_prints_the_completion_object_with_usage(gen_server, key, cli):
    sdk = gen_server.client(key)
    chat = json.loads(_ok(cli("chat", TINY, "-m", "hello there", *SAMPLING, "--json")))
    want = sdk.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "hello there"}], max_tokens=5,
        temperature=0,
    )  # fmt: skip
    assert chat["object"] == "chat.completion" and chat["model"] == TINY
    assert chat["choices"][0]["message"]["content"] == want.choices[0].message.content
    usage = chat["usage"]
    assert usage["prompt_tokens"] == want.usage.prompt_tokens
    assert usage["completion_tokens"] == want.usage.completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    text = json.loads(_ok(cli("complete", TINY, "abc", *SAMPLING, "--json")))
    assert text["object"] == "text_completion" and text["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("command", ["chat", "complete"])
def test_an_unknown_model_is_one_line_and_exit_status_2(cli, command):
    argv = (
        ["chat", "no-such-model", "-m", "hi"]
        if command == "chat"
        else [command, "no-such-model", "hi"]
    )
    for extra in ([], ["--no-stream"]):
        status, out, err = cli(*argv, *extra)
        assert status == 2 and out == "", (status, out, err)
        assert err.startswith("dprc: error: ") and err.count("\n") == 1, err
        assert "no-such-model" in err and "404" in err


class Terminal:
    """``dprc ARGV`` on a pseudo-terminal: what it prints, read up to each prompt."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command on the terminal
            os.execvpe(sys.executable, [sys.executable, "-m", "dprc.cli", *argv], env)
        self.seen = b""

    def until(self, marker: bytes, timeout: float = 120) -> str:
        """The output up to (and without) the next ``marker``."""
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            assert time.monotonic() < deadline, self.seen.decode(errors="replace")
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                self.seen += chunk
        head, _, self.seen = self.seen.partition(marker)
        return head.decode(errors="replace").replace("\r\n", "\n")

    def send(self, line: str) -> None:
        os.write(self.fd, line.encode())

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(self.pid, 9)
        raise AssertionError("the session did not end")


def _answer(segment: str) -> str:
    """The first choice's text of the ``--json`` object in a turn's output."""
    obj = json.loads(segment[segment.index("{") : segment.rindex("}") + 1])
    return obj["choices"][0]["message"]["content"]


def test_a_terminal_session_keeps_the_conversation_and_reset_forgets_it(gen_server, key, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_API_KEY=key,
        DPRC_SERVER_URL=gen_server.base_url,
        DPRC_CLIENT_CONFIG=str(tmp_path / "client.toml"),
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    sdk = gen_server.client(key)

    def want(messages: list[dict]) -> str:
        return (
            sdk.chat.completions.create(model=TINY, messages=messages, max_tokens=5, temperature=0)
            .choices[0]
            .message.content
        )

    term = Terminal(["chat", TINY, *SAMPLING, "--json"], env)
    try:
        assert "/reset" in term.until(b"> ")  # the greeting says how to use it
        term.send("hello\n")
        first = _answer(term.until(b"> "))
        assert first == want([{"role": "user", "content": "hello"}])
        term.send("and then\n")
        second = _answer(term.until(b"> "))
        history = [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "and then"},
        ]
        assert second == want(history)
        term.send("/reset\n")
        assert "forgotten" in term.until(b"> ")
        term.send("and then\n")
        assert _answer(term.until(b"> ")) == want([{"role": "user", "content": "and then"}])
        term.send("\x04")  # Ctrl-D ends the session
        assert term.wait() == 0
    finally:
        try:
            os.kill(term.pid, 0)
        except ProcessLookupError:
            pass
        else:
            os.kill(term.pid, 9)
            os.waitpid(term.pid, 0)
        os.close(term.fd)


def test_a_terminal_without_a_prompt_for_complete_is_refused(cli, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty(""))
    status, _, err = cli("complete", TINY)
    assert status == 2 and "give the PROMPT" in err


@pytest.mark.parametrize("command", ["chat", "complete"])
def test_help_needs_no_torch(tmp_path, command):
    """As the other client commands (tests/dprc/client/test_client_imports.py)."""
    from tests.dprc.client.test_client_imports import _assert_light, _dprc

    proc, imports = _dprc(tmp_path, command, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: dprc {command}"), proc.stderr
    _assert_light(proc, imports)
