"""The range and default of every numeric request field, in one place.

`inhouse serve`'s request models and the gateway's request check both build on these,
so both accept and refuse the same values, and the engine never sees one that can
overflow a tensor (int64), a ``torch.Generator`` seed or an SQLite INTEGER. Ranges
follow OpenAI's API reference and vLLM's protocol where those set one; where neither
does, the cap is far above any real use and says why.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

MAX_N = 16  # choices per request; OpenAI allows 128, a CPU batch of 16 is already slow
# Output tokens: no model has a context of 2**31 tokens, and prompt + n * this still fits
# an SQLite INTEGER (int64) when the gateway reserves it.
MAX_OUTPUT_TOKENS = INT32_MAX
MAX_TOKEN_ID = INT32_MAX  # vocabularies are far smaller; the engine checks the real size
MAX_TOP_K = INT32_MAX  # top-k above the vocabulary keeps every token
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit, vLLM's default max_logprobs
MAX_STOP_STRINGS = 16
# Characters in one stop string: real ones are a few words. The engine scans the text's
# tail for each at every step and holds back from a stream what may begin one, so the
# cost grows with the length (1 MiB passed unchecked before).
MAX_STOP_STRING_CHARS = 256
# Prompts in one /v1/completions batch: each is its own engine request (times n), so a
# batch is bounded like a batch of sequences; OpenAI sets no number, vLLM none.
MAX_COMPLETION_PROMPTS = 256
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS_ENTRIES = 1024
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's
TEMPERATURE_MAX = 2.0  # OpenAI's
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's presence and frequency penalties
REPETITION_PENALTY_MAX = 10.0  # vLLM only asks > 0; beyond 10 every repeat is banned anyway
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's
MAX_EMBEDDING_DIMENSIONS = 65536  # above any embedding model's width
# vLLM's per-request scheduling priority (lower is served earlier); vLLM takes any int, the
# gateway's classes use -1..1, and a thousand levels either side is far more than any use.
PRIORITY_RANGE = (-1000, 1000)
MAX_JSON_DEPTH = 64  # nesting of a request body; real tool schemas stay under 20

# Defaults of a field the request leaves out (OpenAI's, and vLLM's for its extensions).
DEFAULT_N = 1
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = -1  # disabled
DEFAULT_MIN_P = 0.0
DEFAULT_PRESENCE_PENALTY = 0.0
DEFAULT_FREQUENCY_PENALTY = 0.0
DEFAULT_REPETITION_PENALTY = 1.0
DEFAULT_MIN_TOKENS = 0
DEFAULT_COMPLETIONS_MAX_TOKENS = 16  # legacy /v1/completions; chat defaults to the context
DEFAULT_CHAT_MAX_TOKENS: int | None = None  # None: up to max_model_len

# Integers are strict, as OpenAI's are: true, "5" and 5.0 are not integers.
Choices = Annotated[int, Field(ge=1, le=MAX_N, strict=True)]
OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True)]
MinTokens = Annotated[int, Field(ge=0, le=MAX_OUTPUT_TOKENS, strict=True)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID, strict=True)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX, strict=True)]  # vLLM: int64
Priority = Annotated[int, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1], strict=True)]
TopK = Annotated[int, Field(ge=-1, le=MAX_TOP_K, strict=True)]  # -1 and 0 disable it
Temperature = Annotated[float, Field(ge=0.0, le=TEMPERATURE_MAX)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
MinP = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=REPETITION_PENALTY_MAX)]
Logprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS, strict=True)]
TokenIdKey = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]  # JSON keys are strings: "50256"
LogitBiasValue = Annotated[float, Field(ge=LOGIT_BIAS_RANGE[0], le=LOGIT_BIAS_RANGE[1])]
LogitBias = Annotated[
    dict[TokenIdKey, LogitBiasValue],
    Field(
        max_length=MAX_LOGIT_BIAS_ENTRIES,
        json_schema_extra={"propertyNames": {"pattern": "^[0-9]{1,10}$"}},
    ),
]
StopTokenIds = Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]
Stop = StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Dimensions = Annotated[int, Field(ge=1, le=MAX_EMBEDDING_DIMENSIONS, strict=True)]
