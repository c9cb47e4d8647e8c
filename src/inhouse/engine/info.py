"""EngineInfo: the one read-only description of a loaded engine that the server reads.

Model identity and hashes, dtype and weight format, tokenizer and chat template,
``max_model_len`` and the KV budget (blocks, tokens, concurrency and why that size).
The server never reaches into the engine's parts for these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inhouse.engine.prompt_bound import max_token_bytes, refuse_surely_too_long

if TYPE_CHECKING:
    from inhouse.engine.images import ImageSide
    from inhouse.engine.kv_budget import KVBudget
    from inhouse.engine.models.loader import LoadedModel
    from inhouse.engine.speculative.config import SpeculativeConfig


@dataclass(slots=True, frozen=True)
class EngineInfo:
    """What the engine serves and with how much KV cache."""

    model_id: str
    source_path: Path
    source_sha256: str
    hf_folder: Path
    dtype: str
    quantization: str
    kv_cache_dtype: str
    path_reason: str  # why this dtype and weight format on this machine
    device: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    tokenizer: Any
    chat_template: str | None
    budget: KVBudget
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
    max_token_bytes: int | None = None  # the longest token's bytes, where that bounds a count
    images: ImageSide | None = None  # a vision-language model's image processor and encoder

    def refuse_surely_too_long(self, text: str) -> None:
        """Raise :class:`EngineInputError` for a prompt text that cannot fit
        ``max_model_len`` by its length alone, before anyone tokenizes it."""
        refuse_surely_too_long(text, self.max_token_bytes, self.max_model_len)

    @property
    def max_model_len(self) -> int:
        return self.budget.max_model_len

    @classmethod
    def describe(
        cls, loaded: LoadedModel, budget: KVBudget, speculative: SpeculativeConfig | None = None
    ) -> EngineInfo:
        return cls(
            model_id=loaded.model_id,
            source_path=loaded.source_path,
            source_sha256=loaded.source_sha256,
            hf_folder=loaded.hf_folder,
            dtype=str(loaded.dtype).removeprefix("torch."),
            quantization=loaded.quantization,
            kv_cache_dtype=str(loaded.kv_dtype).removeprefix("torch."),
            path_reason=loaded.path_reason,
            device=str(loaded.device),
            vocab_size=int(loaded.hf_config.vocab_size),
            eos_token_ids=frozenset(loaded.eos_token_ids),
            tokenizer=loaded.tokenizer,
            chat_template=loaded.chat_template,
            budget=budget,
            speculative=speculative,
            max_token_bytes=max_token_bytes(loaded.tokenizer),
            images=loaded.images,
        )
