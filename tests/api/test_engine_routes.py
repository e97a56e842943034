"""The router's contract against a second process that speaks the engines' protocol: an
embedded engine started apart (``python -m inference`` on its own port), met once as vLLM
(``vllm_url`` / ``vllm_model``: the model is known to it by name, nothing is registered, the
API starts no engine of its own) and once as an engine started apart (``inference_url``:
the API registers the model, as it does with its own child). The answers are what the engine
itself answers to the same request."""

from __future__ import annotations

import openai
import pytest

from service.models import builtin_models
from service.models.model_registry import ensure_local, get_model
from tests.api.conftest import _serve, _settings
from tests.inference.conftest import running_engine

TINY = builtin_models.TINY_LLAMA
ASK = {"messages": [{"role": "user", "content": "route me"}], "max_tokens": 10, "temperature": 0}


@pytest.fixture(scope="module")
def apart(tmp_path_factory):
    """The engine as its own process, serving the built-in model under its name (as vLLM's
    ``--served-model-name`` would)."""
    tmp = tmp_path_factory.mktemp("engine-apart")
    with running_engine(tmp) as engine:
        settings = _settings(tmp / "probe", None)
        engine.register(TINY, ensure_local(get_model(settings, TINY)))
        yield engine


def _direct(engine) -> str:
    answer = engine.client().chat.completions.create(model=TINY, **ASK)
    return answer.choices[0].message.content


def test_a_vllm_route_sends_the_model_by_name(apart, tmp_path):
    settings = _settings(
        tmp_path,
        None,
        inference_engine="off",
        vllm_url=apart.url,
        vllm_model=TINY,
        vllm_api_key=apart.token,
    )
    with _serve_once(settings) as server:
        client = server.client(server.key("routes"))
        answer = client.chat.completions.create(model=TINY, **ASK)
        assert answer.choices[0].message.content == _direct(apart)
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(model=TINY, stream=True, **ASK)
            if c.choices
        )
        assert streamed == _direct(apart)
        assert server.app.state.relay.engine._proc is None  # no engine of its own
        with pytest.raises(openai.BadRequestError) as refused:  # vLLM answers 400 in its shape
            client.chat.completions.create(model=TINY, **{**ASK, "max_tokens": 10**6 // 32})
        assert refused.value.status_code == 400


def test_an_engine_apart_is_used_instead_of_a_child(apart, tmp_path):
    settings = _settings(tmp_path, None, inference_url=apart.url, inference_token=apart.token)
    with _serve_once(settings) as server:
        client = server.client(server.key("apart"))
        answer = client.chat.completions.create(model=TINY, **ASK)
        assert answer.choices[0].message.content == _direct(apart)
        assert server.app.state.relay.engine._proc is None


def test_a_wrong_engine_token_is_not_a_client_error(apart, tmp_path):
    settings = _settings(
        tmp_path, None, inference_url=apart.url, inference_token="not-the-token-at-all"
    )
    with _serve_once(settings) as server:
        client = server.client(server.key("bad token"))
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model=TINY, **ASK)
        # the engine's 401 is the deployment's fault, not the caller's: never a 401 to them
        assert failed.value.status_code == 502
        assert failed.value.body["code"] == "engine_error"


def _serve_once(settings):
    from contextlib import contextmanager

    return contextmanager(_serve)(settings)


def test_the_engine_does_not_outlive_its_api(tmp_path):
    """kill -9 of the process that started the engine ends the engine too (its parent
    watch), so no orphan keeps a port, memory and loaded models."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time\n"
        "from service.base.settings import Settings\n"
        "from service.inference.engine_process import EngineProcess\n"
        f"e = EngineProcess(Settings(data_dir={str(tmp_path)!r}))\n"
        "e.address()\n"
        "print(e._proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    api = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert api.stdout is not None
        engine_pid = int(api.stdout.readline())
        os.kill(api.pid, signal.SIGKILL)
        api.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(engine_pid):
            assert time.monotonic() < deadline, "the engine outlived its API"
            time.sleep(0.2)
    finally:
        api.kill()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not yet reaped) has exited
        return f.read().split(") ")[1][0] != "Z"
