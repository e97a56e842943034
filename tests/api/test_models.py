"""The model allow-list from settings; names, never paths."""

from __future__ import annotations

import json

import pytest

from service.base.errors import InvalidInput, NotFound
from service.base.settings import ModelSpec, Settings
from service.models import model_registry as service


def test_configured_models(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    settings = Settings(
        data_dir=tmp_path,
        builtin_models=False,
        models={"my-lm": ModelSpec(path=folder, task="causal_lm")},
    )
    reg = service.registry(settings)
    assert list(reg) == ["my-lm"]
    model = service.get_model(settings, "my-lm")
    assert model.task == "causal_lm" and not model.ready
    with pytest.raises(InvalidInput):  # no weights there: refused, nothing downloaded
        service.ensure_local(model)
    (folder / "config.json").write_text("{}")
    assert service.ensure_local(model) == folder.resolve()
    with pytest.raises(NotFound):
        service.get_model(settings, "minilm-l6-v2")  # built-ins switched off


def test_models_from_environment(tmp_path, monkeypatch):
    spec = json.dumps({"x": {"path": str(tmp_path), "task": "classification"}})
    monkeypatch.setenv("DPRC_MODELS", spec)
    settings = Settings(data_dir=tmp_path)
    assert service.registry(settings)["x"].task == "classification"
    assert "minilm-l6-v2" in service.registry(settings)


@pytest.mark.parametrize(
    "name", ["../x", "/abs", "a/b", "a\\b", "..", "", " x", "x" * 200, "C:\\models"]
)
def test_path_like_names_are_refused(name, tmp_path):
    with pytest.raises(InvalidInput):
        service.get_model(Settings(data_dir=tmp_path), name)


def test_chat_format_trains_causal_lm(server):
    from tests.api.conftest import jsonl

    client = server.client(server.key("chat"))
    lines = [
        {
            "messages": [
                {"role": "user", "content": f"hi {i}"},
                {"role": "assistant", "content": "hello"},
            ]
        }
        for i in range(20)
    ]
    f = client.files.create(file=("chat.jsonl", jsonl(lines)), purpose="fine-tune")
    assert f.model_extra["format"] == "chat"
    job = client.fine_tuning.jobs.create(
        model="dprc-tiny-llama",
        training_file=f.id,
        hyperparameters={"n_epochs": 1, "batch_size": 4},
        extra_body={"privacy": {"target_epsilon": 4.0, "clipping": {"method": "hutchpp", "k": 8}}},
    )
    assert job.model_extra["privacy"]["accountant"]["clipping"] == "hutchpp"


def _minilm_check_is_cached() -> bool:
    """Whether a create's model check of MiniLM (default settings) is answered from the cache
    the start-up warms (``service.jobs.model_checks._check_trainable_cached``), asked as a
    create asks."""
    from service.jobs import model_checks
    from service.models import builtin_models

    path = builtin_models.minilm_dir()
    assert path is not None
    stamp = (path / "config.json").stat().st_mtime_ns
    before = model_checks._check_trainable_cached.cache_info()
    assert (
        model_checks._check_trainable_cached(str(path), stamp, "classification", None, None) is None
    )
    return model_checks._check_trainable_cached.cache_info().hits == before.hits + 1


def test_warming_checks_each_model_on_disk_and_logs_a_broken_one(tmp_path, caplog):
    from service.jobs import model_checks

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    settings = Settings(
        data_dir=tmp_path, models={"broken": ModelSpec(path=broken, task="causal_lm")}
    )
    model_checks._check_trainable_cached.cache_clear()
    with caplog.at_level("WARNING", logger="dprc.jobs"):
        warmed = model_checks.warm_model_checks(settings)
    # the tiny Llama is built on first use (not on disk yet): not checked; the broken model
    # is logged and left to the creates that name it
    assert warmed == ["minilm-l6-v2"]
    assert any("'broken'" in r.getMessage() for r in caplog.records)
    assert _minilm_check_is_cached()


@pytest.mark.parametrize("warm", [True, False])
def test_the_server_warms_the_model_checks_before_serving_unless_told_not_to(tmp_path, warm):
    from service.jobs import model_checks
    from tests.api.conftest import _settings, serving

    model_checks._check_trainable_cached.cache_clear()
    with serving(_settings(tmp_path, None, warm_model_checks=warm)) as server:
        assert server.app.state.store is not None  # started: its lifespan ran
        assert _minilm_check_is_cached() is warm
