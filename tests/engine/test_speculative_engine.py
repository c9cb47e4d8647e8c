"""Speculative decoding on the bundled SmolLM2: the same tokens as without it.

Greedy outputs of 50 prompts (chat, code, extraction: prompts that quote text, so prompt
lookup drafts get accepted) are identical with and without drafts on the q4, q8 and
float32 paths, and with suffix decoding, whose history drafts a reply given before;
stop strings, min_tokens, logprobs, a JSON schema and seeded sampling give the same
results too, and every block is back in the pool at the end.
"""

from __future__ import annotations

import pytest
from engine_helpers import generate

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.structured import GrammarCompiler

pytestmark = pytest.mark.slow

# Drafting at every batch size, so the big batches here verify drafts too.
NGRAM = SpeculativeConfig(
    num_speculative_tokens=4,
    prompt_lookup_min=1,
    prompt_lookup_max=3,
    disable_by_batch_size=None,
)
SUFFIX = SpeculativeConfig.parse('{"method": "suffix", "disable_by_batch_size": null}')
TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Paged attention keeps the KV cache in fixed-size blocks, so no memory is wasted.",
    "Continuous batching admits new requests at every step of the engine.",
    "Alice paid 42 dollars for three books on Monday, and Bob paid 17 on Friday.",
    "The meeting moved from Tuesday at 10am to Thursday at 3pm in room 204.",
]
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nprint(os.getcwd())\n",
    "def greet(name):\n    return 'Hello, ' + name\n",
]
ASKS = [
    "Repeat this text exactly: {}",
    "Rewrite this sentence in the past tense: {}",
    "Which words in this text are nouns? {}",
    "Summarize in one line: {}",
]
CODE_ASKS = [
    "Copy this code and add a comment to it:\n{}",
    "Rename the variables in this code:\n{}",
    "Explain this code line by line:\n{}",
]
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List five fruits.",
    "Why is the sky blue?",
    "Say something nice.",
    "Name three colours and repeat them twice.",
    "Count from one to ten in words.",
    "Spell the word banana letter by letter.",
    "How many legs does a spider have?",
    "What does CPU stand for?",
    "Tell me a short story about a cat.",
    "Give me a synonym for happy.",
    "What is 2 + 2? Answer with a number only.",
    "Translate 'good morning' into French.",
    "Explain how a bicycle works.",
]
MESSAGES = (
    [ask.format(text) for ask in ASKS for text in TEXTS]
    + [ask.format(code) for ask in CODE_ASKS for code in CODE]
    + CHAT
)


def chat_prompt(tokenizer, message: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def engine(loaded, speculative: SpeculativeConfig | None) -> LLMEngine:
    config = EngineConfig(
        max_model_len=1024, kv_cache_memory=96 * 2**20, seed=0, speculative=speculative
    )
    return LLMEngine(config, loaded=loaded)


def both(loaded, prompts: dict[str, list[int]], params: SamplingParams):
    """Results without and with speculation, and the speculative engine's counters."""
    plain = generate(engine(loaded, None), prompts, params)
    drafting = engine(loaded, NGRAM)
    speculative = generate(drafting, prompts, params)
    return plain, speculative, drafting.stats().spec_decode


def test_there_are_fifty_prompts():
    assert len(MESSAGES) == 50


@pytest.mark.timeout(1800)  # the float32 path on a busy 2-core CPU: 100 requests, 40 tokens
@pytest.mark.parametrize("path", ["q4", "q8", "fp32"])
def test_fifty_greedy_outputs_are_identical_with_and_without_drafts(path, request):
    loaded = request.getfixturevalue(f"bundled_model_{path}")
    prompts = {f"m{i}": chat_prompt(loaded.tokenizer, m) for i, m in enumerate(MESSAGES)}
    params = SamplingParams(temperature=0, max_tokens=40)
    plain, speculative, counters = both(loaded, prompts, params)
    for request_id in prompts:
        want, got = plain[request_id].choices[0], speculative[request_id].choices[0]
        assert got.token_ids == want.token_ids, request_id
        assert (got.text, got.finish_reason) == (want.text, want.finish_reason), request_id
    assert counters.num_drafts > 50 and counters.num_accepted_tokens > 200
    assert sum(counters.num_accepted_tokens_per_pos) == counters.num_accepted_tokens


def test_suffix_decoding_gives_the_same_tokens_and_drafts_a_reply_given_before(
    bundled_model_q4,
):
    loaded = bundled_model_q4
    prompts = {f"m{i}": chat_prompt(loaded.tokenizer, m) for i, m in enumerate(MESSAGES)}
    params = SamplingParams(temperature=0, max_tokens=40)
    plain = generate(engine(loaded, None), prompts, params)
    drafting = engine(loaded, SUFFIX)
    first = generate(drafting, prompts, params)
    before = drafting.stats().spec_decode
    again = generate(drafting, {f"again-{i}": p for i, p in prompts.items()}, params)
    after = drafting.stats().spec_decode
    for request_id in prompts:
        want = plain[request_id].choices[0]
        for got in (first[request_id].choices[0], again[f"again-{request_id}"].choices[0]):
            assert got.token_ids == want.token_ids, request_id
            assert (got.text, got.finish_reason) == (want.text, want.finish_reason), request_id
    # asked again, each reply is in the history: most of its tokens come from drafts
    generated = sum(len(result.choices[0].token_ids) for result in again.values())
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    assert accepted > 0.6 * generated, (accepted, generated)
    assert drafting.stats().kv_cache_usage == 0


def test_stop_strings_min_tokens_and_logprobs_behave_as_without_drafts(bundled_model_q4):
    tok = bundled_model_q4.tokenizer
    prompt = chat_prompt(tok, ASKS[0].format(TEXTS[1]))
    prompts = {"p": prompt}
    cases = [
        SamplingParams(temperature=0, max_tokens=60, stop=["KV cache"]),
        SamplingParams(
            temperature=0, max_tokens=30, stop=["blocks"], include_stop_str_in_output=True
        ),
        SamplingParams(temperature=0, max_tokens=25, min_tokens=20, logprobs=3),
        SamplingParams(temperature=0, max_tokens=7),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=40, seed=7, n=2),
    ]
    for params in cases:
        plain, speculative, counters = both(bundled_model_q4, prompts, params)
        for index, want in plain["p"].choices.items():
            got = speculative["p"].choices[index]
            assert got.token_ids == want.token_ids, params
            assert (got.text, got.finish_reason, got.stop_reason) == (
                want.text,
                want.finish_reason,
                want.stop_reason,
            ), params
            assert [(lp.token_id, lp.logprob, lp.top) for lp in got.logprobs] == [
                (lp.token_id, lp.logprob, lp.top) for lp in want.logprobs
            ]
        assert counters.num_accepted_tokens > 0, params


def test_a_json_schema_holds_under_drafts_and_gives_the_same_document(bundled_model_q4):
    tok = bundled_model_q4.tokenizer
    compiler = GrammarCompiler(tok, bundled_model_q4.hf_config.vocab_size, {tok.eos_token_id})
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["name", "amount"],
    }
    guide = compiler.json_schema(schema)
    params = SamplingParams(temperature=0, max_tokens=60, guide_factory=guide.factory())
    message = "Extract the payer and amount as JSON: " + TEXTS[3] + " " + TEXTS[3]
    plain, speculative, counters = both(bundled_model_q4, {"p": chat_prompt(tok, message)}, params)
    want, got = plain["p"].choices[0], speculative["p"].choices[0]
    assert got.token_ids == want.token_ids and got.text == want.text
    assert want.text.startswith("{") and counters.num_drafts > 0
