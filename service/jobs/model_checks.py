"""A job's settings against its model, at create: ``max_seq_len`` within the model's positions,
LoRA target modules that match, ``train_only`` that leaves something to train. Checked with the
library's validators (``dprc_core.training.models``) on the model's config and architecture on
the meta device, never its weights; cached per model and settings, and warmed at the API's
start-up (:func:`warm_model_checks`) so no create pays the imports."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dprc_core.training.models import (
    LoraSpec,
    ModelSettingError,
    check_max_seq_len,
    check_trainable,
)
from service.base.errors import InvalidInput
from service.base.settings import Settings
from service.models import model_registry as models

log = logging.getLogger("dprc.jobs")

_SETTING_PARAMS = {
    "max_seq_len": "hyperparameters.max_seq_len",
    "lora": "hyperparameters.lora.target_modules",
    "train_only": "hyperparameters.train_only",
}


def check_model_settings(
    path: Path,
    task: str,
    max_seq_len: int,
    lora: dict[str, Any] | None,
    train_only: Sequence[str] | None,
) -> None:
    """400 if the model at ``path`` cannot take the job's ``max_seq_len`` (beyond its
    positions), LoRA settings (target modules matching no module) or ``train_only`` (leaving
    nothing to train)."""
    lora_key = None
    if lora is not None:  # what the worker gets (hyperparameters["lora"]), hashable
        lora_key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in lora.items())
    only = tuple(train_only) if train_only is not None else None
    stamp = (path / "config.json").stat().st_mtime_ns
    try:
        check_max_seq_len(path, max_seq_len)
    except ModelSettingError as exc:
        refused: tuple[str, str] | None = (exc.field, str(exc))
    else:
        refused = _check_trainable_cached(str(path), stamp, task, lora_key, only)
    if refused is not None:
        field_name, message = refused
        raise InvalidInput(
            message, param=_SETTING_PARAMS[field_name], code="invalid_hyperparameters"
        )


@functools.lru_cache(maxsize=256)
def _check_trainable_cached(
    path: str,
    _config_stamp: int,
    task: str,
    lora: tuple[tuple[str, Any], ...] | None,
    train_only: tuple[str, ...] | None,
) -> tuple[str, str] | None:
    """(field, reason) of a refusal, or None; refusals are cached too (a meta-device build
    costs a fraction of a second of CPU)."""
    spec = None
    if lora is not None:  # as worker.execution.build_spec builds it
        kwargs: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in lora}
        spec = LoraSpec(**kwargs)
    try:
        check_trainable(path, task, spec, list(train_only) if train_only is not None else None)
    except ModelSettingError as exc:
        return exc.field, str(exc)
    return None


def warm_model_checks(settings: Settings) -> list[str]:
    """The model check of a create (:func:`check_model_settings`, a job's default settings) run
    once, at start-up, for each allow-listed model whose weights are on disk: it imports what a
    meta-device build needs (transformers' modeling module of the architecture, torch's
    compiler stack; about 110 MiB and 2 s of CPU for MiniLM, once per process), so no create
    waits for those imports and the API's memory at start already holds them
    (docs/benchmarks/budget.md). The names of the models checked; a model whose check fails
    is logged and left to the creates that name it, which answer its error."""
    warmed = []
    for model in models.registry(settings).values():
        if not model.ready:  # a built-in model built on first use: its first create builds it
            continue
        try:
            stamp = (model.path / "config.json").stat().st_mtime_ns
            _check_trainable_cached(str(model.path), stamp, model.task, None, None)
        except Exception:  # noqa: BLE001 - a create naming it reports the error
            log.warning("the model check of %r failed at start-up", model.name, exc_info=True)
            continue
        warmed.append(model.name)
    return warmed
