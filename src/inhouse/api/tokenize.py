"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shape."""

from __future__ import annotations

from pydantic import BaseModel

from inhouse.api.bounds import TokenId
from inhouse.api.chat import ChatMessage
from inhouse.api.common import RequestModel


class TokenizeRequest(RequestModel):
    """Either a raw ``prompt`` or chat ``messages`` rendered through the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    """Token ids of the prompt and the server's context limit."""

    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(RequestModel):
    """Token ids to turn back into text."""

    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    """The text of the given token ids."""

    prompt: str
