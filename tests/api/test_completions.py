"""``/v1/chat/completions`` and ``/v1/completions`` over uvicorn with the official ``openai``
client, on PostgreSQL and SQLite: the built-in tiny Llama answers what ``model.generate``
answers (the reference: transformers in this process, not the engine), streamed or not; the
refusals are OpenAI-shaped; an overloaded engine answers 429 with Retry-After and never a
5xx; a stream the client closes frees its slot in the engine."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai
import pytest
import torch

from dprc_core.training.chat_template import chat_template_of
from dprc_core.training.models import load_model, load_tokenizer
from service.models import builtin_models
from service.models.model_registry import ensure_local, get_model
from tests.api.conftest import Server, _serve, _settings

TINY = builtin_models.TINY_LLAMA


def _reference(server: Server, prompt_ids: list[int], n: int) -> str:
    """Greedy tokens of the built-in model for ``prompt_ids``, decoded: transformers'
    ``generate`` in this process."""
    path = ensure_local(get_model(server.settings, TINY))
    model = load_model(path, "causal_lm").eval()
    tok = load_tokenizer(path)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )[0, len(prompt_ids) :].tolist()
    eos = tok.eos_token_id
    if eos in out:
        out = out[: out.index(eos)]
    return tok.decode(out, skip_special_tokens=True)


def _chat_ids(server: Server, messages: list[dict]) -> list[int]:
    tok = load_tokenizer(ensure_local(get_model(server.settings, TINY)))
    text = tok.apply_chat_template(
        messages, chat_template=chat_template_of(tok), add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def test_chat_and_text_completions_answer_as_generate(server):
    client = server.client(server.key("gen"))
    messages = [{"role": "user", "content": "hello there"}]
    chat = client.chat.completions.create(
        model=TINY, messages=messages, max_tokens=12, temperature=0
    )
    want = _reference(server, _chat_ids(server, messages), 12)
    assert chat.object == "chat.completion" and chat.model == TINY
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == want
    assert chat.usage.prompt_tokens == len(_chat_ids(server, messages))
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

    pieces, finish = [], None
    for chunk in client.chat.completions.create(
        model=TINY, messages=messages, max_tokens=12, temperature=0, stream=True
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == want
    assert finish == chat.choices[0].finish_reason

    tok = load_tokenizer(ensure_local(get_model(server.settings, TINY)))
    text = client.completions.create(model=TINY, prompt="abcabc", max_tokens=8, temperature=0)
    assert text.choices[0].text == _reference(server, tok("abcabc")["input_ids"], 8)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=TINY, prompt="abcabc", max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == text.choices[0].text


def test_seeded_sampling_repeats_and_n_gives_n_choices(server):
    client = server.client(server.key("gen-seed"))
    ask = dict(model=TINY, prompt="xyz", max_tokens=10, temperature=1.0, seed=11, n=2)
    a, b = client.completions.create(**ask), client.completions.create(**ask)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert sorted(c.index for c in a.choices) == [0, 1]


def test_refusals_are_openai_shaped(server):
    key = server.key("gen-refusals")
    client = server.client(key)
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(
            model="ft:dprc-tiny-llama:other::ftjob-nope",
            messages=[{"role": "user", "content": "x"}],
        )
    assert nf.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as cls:
        client.completions.create(model=builtin_models.MINILM, prompt="x")
    assert cls.value.body["code"] == "model_not_generative"
    with pytest.raises(openai.BadRequestError) as tools:
        client.chat.completions.create(
            model=TINY,
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    assert "tools" in tools.value.message
    with server.http(key) as http:
        for body in (
            {"model": TINY, "prompt": "x", "n": 0},
            {"model": TINY, "prompt": "x", "max_tokens": -1},
            {"model": TINY, "prompt": "x", "temperature": 9},
            {"model": TINY, "prompt": ["a", 1]},
            {"model": TINY, "messages": []},
            {"prompt": "x"},
        ):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            r = http.post(path, json=body)
            assert r.status_code == 400, (body, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = http.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
    with server.http(None) as anonymous:
        r = anonymous.post("/v1/completions", json={"model": TINY, "prompt": "x"})
        assert r.status_code == 401


LONG = "long-llama"


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory):
    """A server whose engine runs one sequence at a time and queues one request, with a model
    slow enough (hidden 256, 4 layers, 2,048 positions) that generations overlap."""
    from dprc_core.training.tiny import build_tiny_llama

    tmp = tmp_path_factory.mktemp("dprc-small-engine")
    long = build_tiny_llama(
        tmp / "long", tokenizer="byte", hidden=256, layers=4, max_positions=2048
    )
    models = {LONG: {"path": str(long), "task": "causal_lm"}}
    settings = _settings(
        tmp / "data", None, inference_max_batch=1, inference_max_queue=1, models=models
    )
    yield from _serve(settings)


def _engine_stats(server: Server) -> dict:
    address = server.app.state.relay.engine.address()
    r = httpx.get(f"{address.url}/stats", headers={"Authorization": f"Bearer {address.token}"})
    return r.json()


def test_an_overloaded_engine_answers_429_never_5xx(small_engine):
    key = small_engine.key("busy")
    body = {"model": LONG, "prompt": "a", "max_tokens": 300, "temperature": 0}

    def ask(_: int) -> httpx.Response:
        with small_engine.http(key) as http:
            return http.post("/v1/completions", json=body)

    with small_engine.http(key) as http:  # loaded first: the burst meets a running slot
        assert http.post("/v1/completions", json={**body, "max_tokens": 1}).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, range(12)))
    statuses = sorted(r.status_code for r in answers)
    assert all(s in (200, 429) for s in statuses), statuses
    assert statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
    busy = next(r for r in answers if r.status_code == 429)
    assert int(busy.headers["retry-after"]) >= 1
    assert busy.json()["error"]["type"] == "rate_limit_error"


def test_a_closed_stream_frees_its_slot(small_engine):
    key = small_engine.key("leaver")
    body = {"model": LONG, "prompt": "a", "max_tokens": 2000, "temperature": 0, "stream": True}
    with small_engine.http(key) as http, http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: a dropped iterator would close the stream
        first = next(lines)
        assert first.startswith("data: ")
        assert json.loads(first.removeprefix("data: "))["object"] == "text_completion", first
        deadline = time.monotonic() + 10
        while _engine_stats(small_engine)["active"] != 1:  # its first step may still be on
            assert time.monotonic() < deadline, _engine_stats(small_engine)
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while _engine_stats(small_engine)["active"] != 0:
        assert time.monotonic() < deadline, "the engine kept generating for a client that left"
        time.sleep(0.1)
    with small_engine.http(key) as http:  # the slot serves the next request
        r = http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 3})
        assert r.status_code == 200


def test_a_killed_engine_is_started_again(small_engine):
    import os
    import signal

    key = small_engine.key("phoenix")
    body = {"model": TINY, "prompt": "abc", "max_tokens": 4, "temperature": 0}
    with small_engine.http(key) as http:
        assert http.post("/v1/completions", json=body).status_code == 200
        proc = small_engine.app.state.relay.engine._proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        again = http.post("/v1/completions", json=body)
        if again.status_code == 503:  # the dead engine's connection was still pooled
            assert again.json()["error"]["code"] == "engine_unavailable"
            assert int(again.headers["retry-after"]) >= 1
            again = http.post("/v1/completions", json=body)
        assert again.status_code == 200, again.text
        assert small_engine.app.state.relay.engine._proc.pid != proc.pid
