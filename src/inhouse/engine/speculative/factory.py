"""The drafter an engine config asks for: none, prompt lookup, or a draft model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.speculative.drafter import Drafter
from inhouse.engine.speculative.ngram import NgramProposer

if TYPE_CHECKING:
    from inhouse.engine.config import EngineConfig
    from inhouse.engine.models.loader import LoadedModel


def make_drafter(
    spec: SpeculativeConfig | None, target: LoadedModel, config: EngineConfig
) -> Drafter | None:
    """The drafter for ``spec`` beside the ``target`` model (None without speculation)."""
    if spec is None:
        return None
    if spec.method == "ngram":
        assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
        proposer = NgramProposer(
            spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max
        )
        return Drafter(spec, proposer)
    raise NotImplementedError(spec.method)
