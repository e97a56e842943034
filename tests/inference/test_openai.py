"""The official ``openai`` client against ``python -m inference``: chat and text completions,
streamed and not, greedy output equal to transformers' ``generate`` for each prompt alone while
the prompts are batched together, usage counts, n, stop strings, seeds, a LoRA adapter."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from dprc_core.training.chat_template import chat_template_of
from tests.inference.conftest import greedy_reference, reference_model

PART = {"type": "text", "text": "wörld ✓"}
CHATS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "A much longer question about the weather " * 3}],
    [{"role": "user", "content": [{"type": "text", "text": "héllo "}, PART]}],
    [{"role": "user", "content": "x"}],
]
PROMPTS = ["Once upon a time", "a", "The quick brown fox jumps over the lazy dog", "∑ über"]
K = 24


@pytest.fixture(scope="module")
def ref(byte_llama):
    return reference_model(byte_llama)


def chat_ids(tok, messages) -> list[int]:
    flat = [
        {
            "role": m["role"],
            "content": m["content"]
            if isinstance(m["content"], str)
            else "".join(p["text"] for p in m["content"]),
        }
        for m in messages
    ]
    text = tok.apply_chat_template(
        flat, chat_template=chat_template_of(tok), add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def test_health_and_models(engine):
    import httpx

    assert httpx.get(engine.url + "/health").status_code == 200
    models = engine.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].object == "model"


def test_greedy_chat_batched_equals_generate_alone(engine, ref):
    model, tok = ref
    client = engine.client()

    def ask(messages):
        return client.chat.completions.create(
            model="tiny", messages=messages, temperature=0, max_tokens=K
        )

    with ThreadPoolExecutor(len(CHATS)) as pool:  # sent at once: decoded in one batch
        answers = list(pool.map(ask, CHATS))
    for messages, answer in zip(CHATS, answers):
        ids = chat_ids(tok, messages)
        expected = greedy_reference(model, ids, K)
        assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
        choice = answer.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content == tok.decode(expected, skip_special_tokens=True)
        assert answer.usage.prompt_tokens == len(ids)
        assert answer.usage.completion_tokens == len(expected)
        assert answer.usage.total_tokens == len(ids) + len(expected)
        stopped = expected[-1] == tok.eos_token_id
        assert choice.finish_reason == ("stop" if stopped else "length")


def test_greedy_completions_batched_equal_generate_alone(engine, ref):
    model, tok = ref
    client = engine.client()
    lengths = [K, 5, 40, 17]

    def ask(args):
        prompt, k = args
        return client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=k)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, zip(PROMPTS, lengths)))
    for prompt, k, answer in zip(PROMPTS, lengths, answers):
        ids = tok(prompt)["input_ids"]
        expected = greedy_reference(model, ids, k)
        assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
        assert answer.choices[0].text == tok.decode(expected, skip_special_tokens=True)
        assert answer.choices[0].logprobs is None
        assert answer.usage.prompt_tokens == len(ids)
        assert answer.usage.completion_tokens == len(expected)


def test_the_reference_can_fail(ref):
    """The comparison above is not vacuous: other prompts give other tokens."""
    model, tok = ref
    a = greedy_reference(model, tok("Once upon a time")["input_ids"], K)
    b = greedy_reference(model, tok("a")["input_ids"], K)
    assert a != b


def test_stream_concatenates_to_the_same_text(engine):
    client = engine.client()
    for messages in CHATS[:3]:
        whole = client.chat.completions.create(
            model="tiny", messages=messages, temperature=0, max_tokens=K
        )
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=messages,
                temperature=0,
                max_tokens=K,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert reasons[-1] == whole.choices[0].finish_reason
        assert [r for r in reasons if r] == reasons[-1:]
        assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    for prompt in PROMPTS:
        whole = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=K)
        chunks = list(
            client.completions.create(
                model="tiny", prompt=prompt, temperature=0, max_tokens=K, stream=True
            )
        )
        assert all(c.object == "text_completion" for c in chunks)
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_raw_stream_is_server_sent_events_ending_in_done(engine):
    import httpx

    body = {"model": "tiny", "prompt": "abc", "max_tokens": 5, "stream": True, "temperature": 0}
    with httpx.stream(
        "POST", engine.url + "/v1/completions", json=body, headers=engine.headers()
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        json.loads(e[len("data: ") :])


def test_n_and_seed(engine):
    client = engine.client()
    kw = dict(model="tiny", messages=CHATS[0], temperature=1.0, max_tokens=K, n=2, seed=1234)
    first = client.chat.completions.create(**kw)
    again = client.chat.completions.create(**kw)
    other = client.chat.completions.create(**{**kw, "seed": 99})
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1]
    assert texts == [c.message.content for c in again.choices]  # same seed, same output
    assert texts[0] != texts[1]  # the two choices are sampled apart
    assert texts != [c.message.content for c in other.choices]
    assert first.usage.completion_tokens >= 2  # both choices counted
    # a seeded stream gives the same text as the seeded request
    chunks = client.chat.completions.create(**{**kw, "n": 1}, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    single = client.chat.completions.create(**{**kw, "n": 1})
    assert streamed == single.choices[0].message.content == texts[0]


def test_top_p_tiny_is_greedy(engine):
    """top_p small enough keeps only the most likely token: the greedy output."""
    client = engine.client()
    greedy = client.completions.create(model="tiny", prompt="abc", temperature=0, max_tokens=K)
    nucleus = client.completions.create(
        model="tiny", prompt="abc", temperature=1.0, top_p=1e-6, max_tokens=K, seed=5
    )
    assert nucleus.choices[0].text == greedy.choices[0].text


def _clean_window(text: str) -> str | None:
    for i in range(4, len(text) - 2):
        piece = text[i : i + 2]
        if "\ufffd" not in piece and piece.strip():
            return piece
    return None


def test_stop_strings(engine):
    client = engine.client()
    for prompt in ["Once", *PROMPTS, "Hello", "0123456789", "zz"]:
        full = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=60)
        text = full.choices[0].text
        stop = _clean_window(text)
        if stop is not None:
            break
    assert stop is not None, "no output with a usable stop string"
    cut = client.completions.create(
        model="tiny", prompt=prompt, temperature=0, max_tokens=60, stop=[stop, "never-there"]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens
    streamed = client.completions.create(
        model="tiny", prompt=prompt, temperature=0, max_tokens=60, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_context_length_exceeded(engine):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        engine.client().completions.create(model="tiny", prompt="y" * 300, max_tokens=4)
    assert err.value.status_code == 400
    assert err.value.body["code"] == "context_length_exceeded"


def test_max_tokens_default_runs_to_the_context(engine, byte_llama):
    """Chat without max_tokens: up to the model's 256 positions (or its end token)."""
    answer = engine.client().chat.completions.create(model="tiny", messages=CHATS[1], temperature=0)
    used = answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert used == 256 or answer.choices[0].finish_reason == "stop"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, byte_llama):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(byte_llama, use_safetensors=True)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"])
    )
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # peft starts B at zero: the adapter would change nothing
    path = tmp_path_factory.mktemp("adapter") / "lora"
    peft_model.save_pretrained(path, safe_serialization=True)
    return path


def test_lora_adapter_equals_peft_reference(engine, byte_llama, adapter, ref):
    import httpx

    body = {"lora_name": "tiny-lora", "lora_path": str(adapter)}
    r = engine.post("/v1/load_lora_adapter", body)  # an adapter needs its base
    assert r.status_code == 400 and r.json()["error"]["param"] == "base_model_path"
    engine.register("tiny-lora", adapter, base=byte_llama)
    engine.register("tiny-lora", adapter, base=byte_llama)  # idempotent
    model, tok = reference_model(byte_llama, adapter)
    base_model, _ = ref
    client = engine.client()
    for prompt in PROMPTS[:3]:
        ids = tok(prompt)["input_ids"]
        expected = greedy_reference(model, ids, K)
        assert expected != greedy_reference(base_model, ids, K)  # the adapter matters
        answer = client.completions.create(
            model="tiny-lora", prompt=prompt, temperature=0, max_tokens=K
        )
        assert answer.choices[0].text == tok.decode(expected, skip_special_tokens=True)
    ids = {m.id for m in client.models.list().data}
    assert ids == {"tiny", "tiny-lora"}
    r = engine.post("/v1/unload_lora_adapter", {"lora_name": "tiny-lora"})
    assert r.status_code == 200
    assert {m.id for m in client.models.list().data} == {"tiny"}
    r = httpx.post(
        engine.url + "/v1/completions",
        json={"model": "tiny-lora", "prompt": "a"},
        headers=engine.headers(),
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
