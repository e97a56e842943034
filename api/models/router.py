"""``GET /v1/models`` and ``GET /v1/models/{model}``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.common import get_store
from api.keys.dependencies import CallerDep
from api.models import service
from api.models.schemas import ModelList, ModelObject

router = APIRouter(prefix="/v1/models", tags=["models"])


def _obj(model: service.Model) -> ModelObject:
    return ModelObject(id=model.name, created=service.CREATED, task=model.task, ready=model.ready)


@router.get("", response_model=ModelList)
def list_models(request: Request, _caller: CallerDep) -> ModelList:
    models = service.registry(get_store(request).settings).values()
    return ModelList(data=[_obj(m) for m in models])


@router.get("/{model}", response_model=ModelObject)
def retrieve_model(model: str, request: Request, _caller: CallerDep) -> ModelObject:
    return _obj(service.get_model(get_store(request).settings, model))
