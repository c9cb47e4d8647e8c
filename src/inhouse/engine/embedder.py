"""The embedding model's runner, next to the chat engine: sentence embeddings as
sentence-transformers computes them (mean pooling, L2 norm).

The default is the bundled all-MiniLM-L6-v2 (384 dimensions). Inputs longer than the
model's ``max_seq_length`` (256 for MiniLM) are truncated, as sentence-transformers does.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from inhouse.engine.threads import use_cpu_threads

DEFAULT_MAX_SEQ_LENGTH = 256
BATCH_SIZE = 32


class Embedder:
    """A BERT-style encoder that turns texts (or its own token ids) into unit vectors."""

    def __init__(self, folder: Path, name: str | None = None) -> None:
        self.folder = Path(folder)
        self.name = name or self.folder.name
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        self.model = AutoModel.from_pretrained(str(self.folder), dtype=torch.float32).eval()
        self.dimensions = int(self.model.config.hidden_size)
        self.max_seq_length = _max_seq_length(self.folder)
        self._lock = threading.Lock()

    def embed(self, inputs: list[str] | list[list[int]]) -> tuple[torch.Tensor, int]:
        """Unit-norm embeddings ``[len(inputs), dimensions]`` and the tokens read."""
        vectors, tokens = [], 0
        use_cpu_threads()
        with self._lock, torch.inference_mode():
            for start in range(0, len(inputs), BATCH_SIZE):
                batch = self._encode(inputs[start : start + BATCH_SIZE])
                tokens += int(batch["attention_mask"].sum())
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                vectors.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
        return torch.cat(vectors), tokens

    def _encode(self, batch: list[str] | list[list[int]]) -> dict[str, torch.Tensor]:
        if batch and isinstance(batch[0], str):
            return self.tokenizer(
                batch,
                padding=True,
                truncation=True,
                max_length=self.max_seq_length,
                return_tensors="pt",
            )
        return self.tokenizer.pad(
            {"input_ids": [ids[: self.max_seq_length] for ids in batch]},
            padding=True,
            return_tensors="pt",
        )


def _max_seq_length(folder: Path) -> int:
    config = folder / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH))
    return DEFAULT_MAX_SEQ_LENGTH
