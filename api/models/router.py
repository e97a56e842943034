"""``GET /v1/models`` and ``GET /v1/models/{model}``: the allow-list and the caller's tenant's
fine-tuned models (service.models.fine_tuned_models)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.app_state import get_store
from api.keys.dependencies import CallerDep
from api.models.schemas import ModelList, ModelObject
from service.models import fine_tuned_models
from service.models.fine_tuned_models import ModelInfo

router = APIRouter(prefix="/v1/models", tags=["models"])


def _obj(model: ModelInfo) -> ModelObject:
    return ModelObject(
        id=model.id,
        created=model.created,
        owned_by=model.owned_by,
        task=model.task,
        ready=model.ready,
    )


@router.get("", response_model=ModelList)
def list_models(request: Request, caller: CallerDep) -> ModelList:
    return ModelList(
        data=[_obj(m) for m in fine_tuned_models.list_models(get_store(request), caller)]
    )


@router.get("/{model}", response_model=ModelObject)
def retrieve_model(model: str, request: Request, caller: CallerDep) -> ModelObject:
    return _obj(fine_tuned_models.get_model_info(get_store(request), caller, model))
