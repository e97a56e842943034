"""Issue 42's end to end, through uvicorn and the official ``openai`` client on SQLite and
PostgreSQL: chat data in OpenAI's format (with ``weight``) → a DP job on the built-in tiny
Llama → ``chat.completions.create(model=job.fine_tuned_model, …)``, streamed and not. The
training lines teach one answer to the last user turn; the fine-tune gives it and the base
model does not. A LoRA fine-tune is served as its adapter over its base and answers what
peft + ``generate`` answer in this process (the reference); another tenant's model is 404."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
import torch

from dprc_core.training.chat_template import chat_template_of
from dprc_core.training.models import load_model, load_tokenizer
from service.models.fine_tuned_models import lookup, unpack, weights_dir
from tests.api.conftest import Server
from tests.worker.conftest import serve_embedded, wait_for

ANSWER = "zebra"
SYSTEM = {"role": "system", "content": "Name an animal."}
ENDED = {"succeeded", "failed", "cancelled"}
PRIVACY = {"privacy": {"target_epsilon": 8.0, "clipping": {"method": "exact"}}}


def _conversation(i: int) -> list[dict]:
    """OpenAI's multi-turn example shape: the first answer has weight 0 (not trained)."""
    return [
        SYSTEM,
        {"role": "user", "content": f"Item {i}?"},
        {"role": "assistant", "content": "Paris", "weight": 0},
        {"role": "user", "content": "Animal?"},
    ]


def _chat_file(n: int) -> bytes:
    lines = [
        {"messages": [*_conversation(i), {"role": "assistant", "content": ANSWER, "weight": 1}]}
        for i in range(n)
    ]
    return ("\n".join(json.dumps(x) for x in lines) + "\n").encode()


def _question() -> list[dict]:
    return [{k: v for k, v in m.items() if k != "weight"} for m in _conversation(999)]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[Server]:
    yield from serve_embedded(request, tmp_path_factory, "chat")


def _train(client, hp: dict) -> object:
    f = client.files.create(
        file=("chat.jsonl", _chat_file(128)), purpose="fine-tune", extra_body={"epsilon_budget": 9}
    )
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama", training_file=f.id, hyperparameters=hp, extra_body=PRIVACY
    )
    job = wait_for(client, job.id, ENDED, timeout=600)
    assert job.status == "succeeded", job.error
    return job


def test_a_dp_chat_fine_tune_answers_through_the_openai_client(served):
    client = served.client(served.key(f"chat {served.settings.data_dir.name}"))
    hp = {"n_epochs": 6, "batch_size": 32, "learning_rate": 0.02, "max_seq_len": 160}
    job = _train(client, hp)
    model = job.fine_tuned_model
    answer = client.chat.completions.create(
        model=model, messages=_question(), max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content == ANSWER
    assert answer.choices[0].finish_reason == "stop"  # it learned the end token too
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model, messages=_question(), max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == ANSWER
    base = client.chat.completions.create(
        model="dprc-tiny-llama", messages=_question(), max_tokens=8, temperature=0
    )
    assert base.choices[0].message.content != ANSWER

    other = served.client(served.key(f"other chat {served.settings.data_dir.name}"))
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.create(model=model, messages=_question(), max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        other.completions.create(model=model, prompt="x", max_tokens=4)


def test_a_lora_fine_tune_is_served_as_its_adapter(served):
    if served.settings.database_url:
        pytest.skip("the adapter path does not depend on the database: SQLite runs it")
    client = served.client(served.key("chat lora"))
    hp = {"n_epochs": 1, "batch_size": 32, "learning_rate": 0.05, "max_seq_len": 160}
    job = _train(client, {**hp, "lora": {"r": 4}})
    answer = client.chat.completions.create(
        model=job.fine_tuned_model, messages=_question(), max_tokens=6, temperature=0
    )
    ft = lookup(served.store, _tenant_id(served, "chat lora"), job.fine_tuned_model)
    adapter = unpack(ft, weights_dir(served.settings, ft.job_id))
    assert (adapter / "adapter_config.json").is_file()
    base_dir = served.settings.models_dir / "dprc-tiny-llama"
    model = load_model(base_dir, "causal_lm", adapter_path=adapter).eval()
    tok = load_tokenizer(adapter)
    text = tok.apply_chat_template(
        _question(),
        chat_template=chat_template_of(tok),
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1] :].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    assert answer.choices[0].message.content == tok.decode(new, skip_special_tokens=True)


def _tenant_id(served: Server, name: str) -> int:
    from sqlalchemy import select

    from service.store.tables import Tenant

    with served.store.sessions() as session:
        tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    assert tenant_id is not None
    return int(tenant_id)
