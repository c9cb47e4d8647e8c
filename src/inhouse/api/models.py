"""``GET /v1/models``: the served models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelCard(BaseModel):
    """One served model."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inhouse"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model (vLLM's field)
    max_model_len: int | None = None


class ModelList(BaseModel):
    """The list ``GET /v1/models`` returns."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
