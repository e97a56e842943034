"""The registered models (name → local folder) and the bounded cache of loaded ones.

A name is registered with ``POST /v1/load_lora_adapter`` and loaded lazily, by the generation
thread, the first time a request uses it. Loaded models sit in a least-recently-used cache
bounded by the sum of their parameter and buffer bytes (``--cache-bytes``); a model in use by
the running batch is pinned and never evicted under it."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dprc_core.generation import eos_ids
from dprc_core.training.models import ModelLoadError, check_model_dir, max_positions
from inference.errors import APIError, bad_request

log = logging.getLogger("inference")


@dataclass(frozen=True)
class Registration:
    name: str
    path: Path  # a model folder, or a PEFT adapter folder over ``base``
    base: Path | None
    created: int = field(default_factory=lambda: int(time.time()), compare=False)

    @property
    def is_adapter(self) -> bool:
        return self.base is not None


def _is_adapter_dir(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def check_registration(name: str, lora_path: str, base_model_path: str | None) -> Registration:
    """A :class:`Registration` for the folders given, or 400 naming what is wrong."""
    path = Path(lora_path)
    if not path.is_dir():
        raise bad_request(f"lora_path {lora_path!r} is not a folder", param="lora_path")
    if _is_adapter_dir(path):
        if not (path / "adapter_model.safetensors").is_file():
            raise bad_request(
                f"adapter folder {lora_path!r} has no adapter_model.safetensors",
                param="lora_path",
            )
        try:
            json.loads((path / "adapter_config.json").read_text())
        except (OSError, ValueError):
            raise bad_request("adapter_config.json is not valid JSON", param="lora_path") from None
        if base_model_path is None:
            raise bad_request(
                "a PEFT adapter needs base_model_path (the folder of its base model)",
                param="base_model_path",
            )
        try:
            base = check_model_dir(base_model_path)
        except ModelLoadError as err:
            raise bad_request(str(err), param="base_model_path") from None
        return Registration(name, path.resolve(), base.resolve())
    try:
        check_model_dir(path)
    except ModelLoadError as err:
        raise bad_request(
            f"{err} (nor is it a PEFT adapter folder: no adapter_config.json)", param="lora_path"
        ) from None
    return Registration(name, path.resolve(), None)


def _folder_bytes(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.glob(pattern))


def weight_file_bytes(reg: Registration) -> int:
    """The size of the weights on disk: a lower bound of what loading takes (float32 or as
    stored), used to refuse a model bigger than the whole budget before reading it."""
    if reg.base is not None:
        return _folder_bytes(reg.base, "*.safetensors") + _folder_bytes(reg.path, "*.safetensors")
    return _folder_bytes(reg.path, "*.safetensors")


@dataclass
class Loaded:
    reg: Registration
    model: Any
    tokenizer: Any
    eos_ids: frozenset[int]
    positions: int
    nbytes: int
    pins: int = 0


def model_bytes(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def load(reg: Registration) -> Loaded:
    """Model and tokenizer of ``reg``, in eval mode (safetensors, local, no remote code)."""
    import torch

    from dprc_core.training.models import load_model, load_tokenizer

    base = reg.base if reg.base is not None else reg.path
    tok_dir = reg.path if (reg.path / "tokenizer_config.json").is_file() else base
    with torch.no_grad():
        model: Any = load_model(base, "causal_lm", adapter_path=reg.path if reg.base else None)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = load_tokenizer(tok_dir)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    positions = max_positions(base) or int(getattr(inner.config, "max_position_embeddings", 2048))
    return Loaded(
        reg=reg,
        model=model,
        tokenizer=tokenizer,
        eos_ids=eos_ids(inner, tokenizer),
        positions=positions,
        nbytes=model_bytes(model),
    )


class ModelCache:
    """Registrations (any thread) and loaded models (the generation thread only)."""

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self._lock = threading.Lock()
        self._registered: dict[str, Registration] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self.evictions = 0

    # ---------------------------------------------------------------- registrations
    def register(self, reg: Registration) -> bool:
        """Register ``reg``; False when the same name and folders already are. 400 when the
        name is registered with other folders."""
        with self._lock:
            old = self._registered.get(reg.name)
            if old is not None:
                if (old.path, old.base) == (reg.path, reg.base):
                    return False
                raise bad_request(
                    f"model {reg.name!r} is already registered with other folders; unload it first",
                    param="lora_name",
                    code="model_exists",
                )
            self._registered[reg.name] = reg
            return True

    def unregister(self, name: str) -> None:
        with self._lock:
            if self._registered.pop(name, None) is None:
                raise APIError(
                    404, f"the model {name!r} does not exist", "model_not_found", "lora_name"
                )

    def registration(self, name: str) -> Registration | None:
        with self._lock:
            return self._registered.get(name)

    def registrations(self) -> list[Registration]:
        with self._lock:
            return list(self._registered.values())

    # ---------------------------------------------------------------- loaded models
    def cached(self) -> list[str]:
        with self._lock:
            return list(self._loaded)

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._loaded.values())

    def acquire(self, name: str) -> Loaded:
        """The loaded model ``name``, loading it (and evicting the least recently used) when
        needed, pinned until :meth:`release`. Raises :class:`APIError`."""
        reg = self.registration(name)
        if reg is None:
            raise APIError(404, f"the model {name!r} does not exist", "model_not_found", "model")
        with self._lock:
            entry = self._loaded.get(name)
            if entry is not None and entry.reg != reg:  # re-registered with other folders
                self._loaded.pop(name)
                entry = None
            if entry is not None:
                self._loaded.move_to_end(name)
                entry.pins += 1
                return entry
        on_disk = weight_file_bytes(reg)
        if on_disk > self.limit:
            raise self._too_large(name, on_disk)
        self._make_room(on_disk)
        t0 = time.perf_counter()
        try:
            entry = load(reg)
        except Exception as err:  # a broken folder fails in many ways: answer it, go on
            log.warning("model %s failed to load: %s", name, type(err).__name__)
            raise bad_request(
                f"the model {name!r} could not be loaded: {type(err).__name__}: {err}"[:1000],
                param="model",
                code="model_load_failed",
            ) from None
        if entry.nbytes > self.limit:
            raise self._too_large(name, entry.nbytes)
        self._make_room(entry.nbytes)
        with self._lock:
            entry.pins = 1
            self._loaded[name] = entry
        log.info(
            "loaded model %s: %.1f MiB in %.2f s",
            name,
            entry.nbytes / 2**20,
            time.perf_counter() - t0,
        )
        return entry

    def release(self, entry: Loaded) -> None:
        with self._lock:
            entry.pins = max(0, entry.pins - 1)
            if self._registered.get(entry.reg.name) != entry.reg and entry.pins == 0:
                if self._loaded.get(entry.reg.name) is entry:
                    self._loaded.pop(entry.reg.name)  # unloaded while it ran

    def drop_unregistered(self) -> None:
        with self._lock:
            for name in [n for n, e in self._loaded.items() if e.pins == 0]:
                if self._registered.get(name) != self._loaded[name].reg:
                    self._loaded.pop(name)

    def _make_room(self, needed: int) -> None:
        with self._lock:
            used = sum(e.nbytes for e in self._loaded.values())
            for name in list(self._loaded):
                if used + needed <= self.limit:
                    break
                entry = self._loaded[name]
                if entry.pins:
                    continue
                self._loaded.pop(name)
                used -= entry.nbytes
                self.evictions += 1
                log.info("evicted model %s (%.1f MiB)", name, entry.nbytes / 2**20)
        if used + needed > self.limit:
            raise APIError(
                429,
                "the models in use fill the engine's model cache; retry later",
                "rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        import gc

        gc.collect()

    def _too_large(self, name: str, nbytes: int) -> APIError:
        return bad_request(
            f"the model {name!r} needs {nbytes} bytes, more than the engine's whole model cache "
            f"({self.limit} bytes, --cache-bytes)",
            param="model",
            code="model_too_large",
        )
