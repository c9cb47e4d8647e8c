"""OpenAI protocol models and error shapes, shared by server, gateway and bench.

Pure pydantic: importing this package never imports torch or the engine.
"""

from inhouse.api.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ResponseFormat,
    ToolCall,
    ToolDefinition,
)
from inhouse.api.common import StreamOptions, Usage
from inhouse.api.completions import Completion, CompletionRequest
from inhouse.api.embeddings import EmbeddingRequest, EmbeddingResponse
from inhouse.api.errors import APIError, ErrorDetail, ErrorResponse
from inhouse.api.models import ModelCard, ModelList
from inhouse.api.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

__all__ = [
    "APIError",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Completion",
    "CompletionRequest",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "ErrorDetail",
    "ErrorResponse",
    "ModelCard",
    "ModelList",
    "ResponseFormat",
    "StreamOptions",
    "TokenizeRequest",
    "TokenizeResponse",
    "ToolCall",
    "ToolDefinition",
    "Usage",
]
