"""OpenAI model objects, with the task type and whether the weights are on disk."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dprc"
    task: Literal["causal_lm", "classification"]
    ready: bool


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]
