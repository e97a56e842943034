"""The bounded model cache: least recently used models evicted to fit ``--cache-bytes``, a
model bigger than the whole budget refused, a model that fails to load answered 400 with the
engine still serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.inference.conftest import reference_model, running_engine


def nbytes(path: Path) -> int:
    model, _ = reference_model(path)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@pytest.fixture(scope="module")
def big_llama(tmp_path_factory) -> Path:
    from dprc_core.training.tiny import build_tiny_llama

    path = tmp_path_factory.mktemp("inference") / "big"
    return build_tiny_llama(path, tokenizer="byte", hidden=256)


@pytest.fixture(scope="module")
def one_model(tmp_path_factory, byte_llama, byte_llama_b, big_llama):
    budget = int(nbytes(byte_llama) * 1.5)  # room for one tiny model, not two
    assert nbytes(byte_llama_b) * 2 > budget and nbytes(big_llama) > budget
    broken = tmp_path_factory.mktemp("inference") / "broken"
    broken.mkdir(exist_ok=True)
    for f in byte_llama.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with running_engine(tmp_path_factory.mktemp("engine"), "--cache-bytes", str(budget)) as e:
        e.register("a", byte_llama)
        e.register("b", byte_llama_b)
        e.register("big", big_llama)
        e.register("broken", broken)
        yield e, budget


def ask(engine, model: str):
    return engine.post("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 3})


def test_least_recently_used_model_is_evicted(one_model, byte_llama):
    engine, budget = one_model
    assert ask(engine, "a").status_code == 200
    s = engine.stats()
    assert s["cached_models"] == ["a"] and s["cache_limit_bytes"] == budget
    assert s["cache_bytes"] == nbytes(byte_llama)
    evicted = s["evictions"]
    assert ask(engine, "b").status_code == 200
    s = engine.stats()
    assert s["cached_models"] == ["b"] and s["evictions"] == evicted + 1
    assert s["cache_bytes"] <= budget
    assert ask(engine, "a").status_code == 200
    s = engine.stats()
    assert s["cached_models"] == ["a"] and s["evictions"] == evicted + 2


def test_a_model_bigger_than_the_budget_is_refused(one_model):
    engine, _ = one_model
    r = ask(engine, "big")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "model_too_large"
    assert "big" not in engine.stats()["cached_models"]


def test_a_model_that_fails_to_load_is_400_and_the_engine_lives_on(one_model):
    engine, _ = one_model
    r = ask(engine, "broken")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "model_load_failed"
    assert ask(engine, "a").status_code == 200
