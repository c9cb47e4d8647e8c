"""The drafter an engine config asks for: none, prompt lookup, suffix decoding, or a draft
model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inhouse.engine.models.loader import LoadedModel, load_model
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.speculative.draft_model import DraftModelProposer, check_same_vocabulary
from inhouse.engine.speculative.drafter import Drafter
from inhouse.engine.speculative.history import OutputHistory
from inhouse.engine.speculative.length import DraftLength
from inhouse.engine.speculative.ngram import NgramProposer
from inhouse.engine.speculative.suffix import SuffixProposer

if TYPE_CHECKING:
    from inhouse.engine.config import EngineConfig


def make_drafter(
    spec: SpeculativeConfig | None, target: LoadedModel, config: EngineConfig, num_blocks: int
) -> Drafter | None:
    """The drafter for ``spec`` beside the ``target`` model (None without speculation); a
    draft model gets a KV cache of ``num_blocks`` blocks, as many as the target's."""
    if spec is None:
        return None
    if spec.method == "ngram":
        assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
        proposer = NgramProposer(
            spec.num_speculative_tokens,
            spec.prompt_lookup_min,
            spec.prompt_lookup_max,
            match_caps=spec.adaptive_length,
        )
        return Drafter(spec, proposer)
    if spec.method == "suffix":
        depth, factor = spec.suffix_decoding_max_tree_depth, spec.suffix_decoding_max_spec_factor
        history = OutputHistory(
            spec.suffix_decoding_max_cached_requests,
            depth,
            factor,
            spec.suffix_decoding_min_token_prob,
        )
        suffix = SuffixProposer(spec.num_speculative_tokens, depth, factor, history)
        return Drafter(spec, suffix, history=history)
    assert spec.model is not None
    draft = load_model(spec.model, config.dtype, config.device, quantization=config.quantization)
    check_same_vocabulary(draft, target)
    # adaptive_length: prompt lookup's drafts follow their match (match_caps), a draft
    # model's the fate of its last draft
    length = DraftLength(spec.num_speculative_tokens) if spec.adaptive_length else None
    return Drafter(spec, DraftModelProposer(draft, num_blocks, config.block_size), length)
