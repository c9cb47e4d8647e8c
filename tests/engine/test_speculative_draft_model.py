"""A draft model as the drafter: a tiny random-weight Llama sharing SmolLM2's tokenizer,
written by the test. Its drafts are mostly wrong (that is not the point): the target's
greedy tokens stay exactly those without speculation. A draft model with another
vocabulary is refused with a sentence that says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import generate
from test_speculative_engine import MESSAGES, chat_prompt, engine

from inhouse.engine.errors import EngineConfigError
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.speculative.config import SpeculativeConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def random_draft(bundled_model_q4, tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    target = bundled_model_q4
    config = LlamaConfig(
        vocab_size=target.hf_config.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=target.tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("random-draft")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return folder


def test_a_random_draft_model_leaves_greedy_outputs_unchanged(bundled_model_q4, random_draft):
    spec = SpeculativeConfig(
        model=str(random_draft), num_speculative_tokens=3, disable_by_batch_size=None
    )
    tok = bundled_model_q4.tokenizer
    prompts = {f"m{i}": chat_prompt(tok, m) for i, m in enumerate(MESSAGES[::5])}
    params = SamplingParams(temperature=0, max_tokens=24)
    plain = generate(engine(bundled_model_q4, None), prompts, params)
    drafting = engine(bundled_model_q4, spec)
    speculative = generate(drafting, prompts, params)
    for request_id in prompts:
        assert (
            speculative[request_id].choices[0].token_ids == plain[request_id].choices[0].token_ids
        )
    counters = drafting.stats().spec_decode
    assert counters.num_drafts > 0 and counters.num_draft_tokens > counters.num_accepted_tokens
    proposer = drafting.core.drafter.proposer
    assert proposer.kv_cache.num_free_blocks == proposer.kv_cache.pool.num_blocks


def test_a_draft_model_with_another_vocabulary_is_refused(bundled_model_q4, tiny_llama_folder):
    spec = SpeculativeConfig(model=str(tiny_llama_folder), num_speculative_tokens=2)
    with pytest.raises(EngineConfigError, match="must share the target's tokenizer"):
        engine(bundled_model_q4, spec)
