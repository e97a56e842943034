"""The folder of whole weights a model name stands for, for a job that starts from it or for an
engine that puts an adapter on it: an allow-listed model's folder (a built-in one built on first
use), a full fine-tune's unpacked checkpoint, or a LoRA fine-tune's adapter **merged** into the
whole folder its own job started from (``merge_and_unload``), written once beside its unpacked
adapter (a folder of its own, then renamed: concurrent workers never see half a model).

So a LoRA fine-tune can be the start of another job (supervised fine-tuning with LoRA, then DPO
from it) and the model under another fine-tune's adapter. A chain of LoRA fine-tunes merges
each link in turn. Merging is post-processing of the released (DP) weights: no privacy is
involved. A classification LoRA fine-tune (its head saved with the adapter) is not merged: it
cannot be a start (400 at create, ``model_unavailable``)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from service.models import fine_tuned_models, model_registry
from service.models.fine_tuned_models import FineTuned, is_fine_tuned
from service.store.store import Store

MERGED = "merged"


def whole_folder(store: Store, tenant_id: int, name: str) -> Path:
    """The folder of whole weights ``name`` stands for (see the module docstring)."""
    if not is_fine_tuned(name):
        return model_registry.ensure_local(model_registry.get_model(store.settings, name))
    ft = fine_tuned_models.lookup(store, tenant_id, name)
    weights = fine_tuned_models.unpack(ft, fine_tuned_models.weights_dir(store.settings, ft.job_id))
    if not ft.lora:
        return weights
    return _merged(ft, weights, whole_folder(store, tenant_id, ft.start_model))


def _merged(ft: FineTuned, adapter: Path, start: Path) -> Path:
    from dprc_core.training.models import load_model, load_tokenizer

    target = adapter.with_name(f"{ft.job_id}-{MERGED}")
    if (target / "config.json").is_file():
        return target
    if ft.base.task != "causal_lm":
        raise ValueError(f"the LoRA fine-tune {ft.name} is a classification model: not merged")
    tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        model = load_model(start, "causal_lm", adapter_path=adapter)
        whole = model.merge_and_unload()  # type: ignore[operator]  # a PeftModel's
        whole.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(adapter).save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)  # a folder left half-made by an older writer
        try:
            tmp.rename(target)
        except OSError:  # another worker renamed its copy first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
