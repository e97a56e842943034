"""``GET /v1/models`` and ``GET /v1/models/{model}``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.app_state import get_store
from api.keys.dependencies import CallerDep
from api.models.schemas import ModelList, ModelObject
from service.model_registry import Model, get_model, registry

router = APIRouter(prefix="/v1/models", tags=["models"])

CREATED = 1735689600  # 2025-01-01: the allow-list has no creation time of its own


def _obj(model: Model) -> ModelObject:
    return ModelObject(id=model.name, created=CREATED, task=model.task, ready=model.ready)


@router.get("", response_model=ModelList)
def list_models(request: Request, _caller: CallerDep) -> ModelList:
    models = registry(get_store(request).settings).values()
    return ModelList(data=[_obj(m) for m in models])


@router.get("/{model}", response_model=ModelObject)
def retrieve_model(model: str, request: Request, _caller: CallerDep) -> ModelObject:
    return _obj(get_model(get_store(request).settings, model))
