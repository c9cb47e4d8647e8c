"""The embedding model's runner, next to the chat engine: sentence embeddings as
sentence-transformers computes them (mean pooling, L2 norm).

The default is the bundled all-MiniLM-L6-v2 (384 dimensions). Inputs longer than the
model's ``max_seq_length`` (256 for MiniLM) are truncated, as sentence-transformers does.
:class:`~inhouse.engine.embedding_scheduler.EmbeddingScheduler` decides which inputs
run together; this class only tokenizes and computes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

DEFAULT_MAX_SEQ_LENGTH = 256


class Embedder:
    """A BERT-style encoder that turns texts (or its own token ids) into unit vectors.

    Not thread-safe: one thread (the scheduler's) calls :meth:`token_ids` and :meth:`embed`.
    """

    def __init__(self, folder: Path, name: str | None = None) -> None:
        self.folder = Path(folder)
        self.name = name or self.folder.name
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        self.model = AutoModel.from_pretrained(str(self.folder), dtype=torch.float32).eval()
        self.dimensions = int(self.model.config.hidden_size)
        self.max_seq_length = _max_seq_length(self.folder)

    def token_ids(self, inputs: list[str] | list[list[int]]) -> list[list[int]]:
        """What the model reads of each input: texts tokenized with the special tokens,
        token ids as given; both truncated to ``max_seq_length``."""
        if inputs and isinstance(inputs[0], str):
            encoded = self.tokenizer(inputs, truncation=True, max_length=self.max_seq_length)
            return encoded["input_ids"]
        return [list(ids[: self.max_seq_length]) for ids in inputs]  # type: ignore[index]

    @torch.inference_mode()
    def embed(self, rows: list[list[int]]) -> torch.Tensor:
        """Unit-norm embeddings ``[len(rows), dimensions]`` of token-id rows, run as one
        padded batch."""
        batch = self.tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


def _max_seq_length(folder: Path) -> int:
    config = folder / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH))
    return DEFAULT_MAX_SEQ_LENGTH
