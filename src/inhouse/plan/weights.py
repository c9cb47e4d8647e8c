"""Weight bytes: from a spec and a format, or from the real tensors of a GGUF file."""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.plan.formats import WeightFormat
from inhouse.plan.gguf_header import TensorInventory
from inhouse.plan.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes of all weights, with the parts a decode step does not read."""

    total: int
    embedding: int  # the input table; a token reads one row of it unless it is tied
    routed_experts: int
    format_name: str
    description: str

    def read_per_step(self, spec: ModelSpec, batch: int = 1) -> int:
        """Bytes one decode step of `batch` sequences streams from memory.

        Everything but the input table (one row per token, unless tied to lm_head) and
        the experts no token in the batch routes to: each token picks k of E, so a
        batch touches a share 1 − (1 − k/E)^batch of them.
        """
        skipped = 0 if spec.tie_word_embeddings else self.embedding
        if spec.is_moe:
            idle_share = (1 - spec.experts_per_token / spec.num_experts) ** max(batch, 1)
            skipped += int(self.routed_experts * idle_share)
        return self.total - skipped


def weight_bytes(spec: ModelSpec, fmt: WeightFormat) -> WeightBytes:
    """Weights of `spec` stored in `fmt`; tied embeddings count once."""
    counts = spec.param_counts()
    embedding_bits = (counts.embedding + counts.lm_head) * fmt.embedding_bits
    bits = counts.linear * fmt.linear_bits + embedding_bits + counts.other * fmt.other_bits
    return WeightBytes(
        total=round(bits / 8),
        embedding=round(counts.embedding * fmt.embedding_bits / 8),
        routed_experts=round(counts.routed_experts * fmt.linear_bits / 8),
        format_name=fmt.name,
        description=fmt.note,
    )


def gguf_weight_bytes(tensors: TensorInventory) -> WeightBytes:
    """Weights exactly as a GGUF file stores them, tensor by tensor."""
    return WeightBytes(
        total=tensors.total_bytes,
        embedding=tensors.embedding_bytes,
        routed_experts=tensors.routed_expert_bytes,
        format_name=f"gguf ({tensors.main_type})",
        description=f"tensors in the file: {tensors.describe()}",
    )
