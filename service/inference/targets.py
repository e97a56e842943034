"""What a completion request's ``model`` names: an allow-listed causal LM or one of the
caller's tenant's ``ft:`` models, as the folders an engine loads (a full model, or a LoRA
adapter over the folder of the model its job started from).

Any role that may read a model may generate with it; another tenant's model, an unknown one
and one whose weights were deleted are all 404 ``model_not_found``, as in ``GET /v1/models``.
Generation is post-processing of the model, a differentially private release: it spends no
privacy budget (docs/inference.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.base.errors import InvalidInput
from service.governance.keys import Caller
from service.governance.roles import Action, authorize
from service.models import fine_tuned_models, model_folders, model_registry
from service.models.fine_tuned_models import FineTuned, is_fine_tuned
from service.store.store import Store


@dataclass(frozen=True)
class ServedModel:
    """A model as an engine registers it: ``name`` (the public name), the folder it loads
    (``path``), and for a LoRA fine-tune the folder of the model under the adapter
    (``base_path``) and that model's name (``base_name``)."""

    name: str
    path: Path
    base_path: Path | None = None
    base_name: str | None = None

    @property
    def lora(self) -> bool:
        return self.base_path is not None


def _not_generative(name: str) -> InvalidInput:
    return InvalidInput(
        f"the model {name!r} is a classification model: completions need a causal language "
        "model (see GET /v1/models, task causal_lm)",
        param="model",
        code="model_not_generative",
    )


def served_model(store: Store, caller: Caller, name: str) -> ServedModel:
    """The folders that serve ``name`` for ``caller`` (unpacking a fine-tune's weights once,
    building a built-in model on first use)."""
    authorize(caller, Action.READ)
    if not is_fine_tuned(name):
        model = model_registry.get_model(store.settings, name)
        if model.task != "causal_lm":
            raise _not_generative(name)
        return ServedModel(name, model_registry.ensure_local(model))
    ft = fine_tuned_models.lookup(store, caller.tenant_id, name)
    if ft.base.task != "causal_lm":
        raise _not_generative(name)
    path = _weights(store, ft)
    if not ft.lora:
        return ServedModel(name, path)
    # the adapter sits on the whole model its job started from (a LoRA start merged)
    start = model_folders.whole_folder(store, caller.tenant_id, ft.start_model)
    return ServedModel(name, path, start, ft.start_model)


def _weights(store: Store, ft: FineTuned) -> Path:
    return fine_tuned_models.unpack(ft, fine_tuned_models.weights_dir(store.settings, ft.job_id))
