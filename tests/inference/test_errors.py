"""Bad requests answer 4xx in OpenAI's error shape, never 5xx; the token is required."""

from __future__ import annotations

import httpx
import pytest


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def chat(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_no_or_wrong_token_is_401(engine):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": engine.token}):
        r = httpx.post(engine.url + "/v1/chat/completions", json=chat(), headers=headers)
        assert error_of(r, 401)["type"] == "invalid_request_error"
        assert error_of(httpx.get(engine.url + "/v1/models", headers=headers), 401)
        assert error_of(httpx.get(engine.url + "/stats", headers=headers), 401)
    assert httpx.get(engine.url + "/health").status_code == 200  # health needs no token


def test_the_openai_client_sees_401(engine):
    import openai

    client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_not_json(engine):
    r = httpx.post(
        engine.url + "/v1/chat/completions", content=b"{not json", headers=engine.headers()
    )
    error_of(r, 400)
    r = httpx.post(engine.url + "/v1/completions", content=b"[1, 2]", headers=engine.headers())
    error_of(r, 400)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(messages="hi"), "messages"),
        (chat(messages=[]), "messages"),
        (chat(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
        (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages"),
        (chat(n=0), "n"),
        (chat(n=9), "n"),
        (chat(temperature=-1), "temperature"),
        (chat(temperature="hot"), "temperature"),
        (chat(top_p=0), "top_p"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens=10**6), "max_tokens"),
        (chat(max_completion_tokens=10**6), "max_tokens"),
        (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
        (chat(stop=""), "stop"),
        (chat(stream="yes please"), "stream"),
        (chat(seed=2**70), "seed"),
        (chat(model=5), "model"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ],
)
def test_invalid_chat_bodies_are_400(engine, body, param):
    err = error_of(engine.post("/v1/chat/completions", body), 400)
    assert err["param"] is not None and err["param"].startswith(param), err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logprobs", True),
        ("top_logprobs", 3),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("response_format", {"type": "json_object"}),
        ("logit_bias", {"5": 10}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1),
    ],
)
def test_unsupported_sampling_fields_are_named(engine, field, value):
    err = error_of(engine.post("/v1/chat/completions", chat(**{field: value})), 400)
    assert err["param"] == field and field in err["message"]


def test_neutral_and_unknown_fields_are_accepted(engine):
    body = chat(
        max_tokens=3,
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0.0,
        response_format={"type": "text"},
        user="someone",
        some_future_field={"x": 1},
    )
    r = engine.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text


def test_completion_bodies(engine):
    err = error_of(engine.post("/v1/completions", {"model": "tiny", "prompt": ["a", "b"]}), 400)
    assert err["param"] == "prompt"
    echo = {"model": "tiny", "prompt": "a", "echo": True}
    err = error_of(engine.post("/v1/completions", echo), 400)
    assert err["param"] == "echo"
    err = error_of(engine.post("/v1/completions", {"model": "tiny", "prompt": ""}), 400)
    assert err["param"] == "prompt"
    r = engine.post("/v1/completions", {"model": "tiny", "prompt": ["a"], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2


def test_unknown_model_is_404(engine):
    import openai

    err = error_of(engine.post("/v1/chat/completions", chat(model="nope")), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        engine.client().completions.create(model="nope", prompt="a")


def test_unknown_route_is_404_in_shape(engine):
    error_of(httpx.get(engine.url + "/v1/nothing", headers=engine.headers()), 404)


def test_body_size_is_limited(engine):
    big = chat(messages=[{"role": "user", "content": "x" * (2**20 + 10)}])
    err = error_of(engine.post("/v1/chat/completions", big), 413)
    assert err["code"] == "too_large"


@pytest.mark.parametrize(
    "body",
    [
        {"lora_name": "x", "lora_path": "/nonexistent/folder"},
        {"lora_name": "x"},
        {"lora_name": "", "lora_path": "/tmp"},
        {"lora_name": "x", "lora_path": "/tmp"},  # a folder, but no model in it
    ],
)
def test_bad_registrations_are_400(engine, body):
    error_of(engine.post("/v1/load_lora_adapter", body), 400)


def test_registration_conflicts_and_unknown_unloads(engine, byte_llama, tmp_path):
    engine.register("tiny", byte_llama)  # the same again: fine
    other = tmp_path / "copy"
    other.mkdir()
    for f in byte_llama.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    r = engine.post("/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": str(other)})
    assert error_of(r, 400)["code"] == "model_exists"
    r = engine.post("/v1/unload_lora_adapter", {"lora_name": "never-registered"})
    assert error_of(r, 404)["code"] == "model_not_found"
