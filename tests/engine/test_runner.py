"""ModelRunner at the step level: chunked prefill, mixed batches and shared prefix blocks
give the same logits as one plain pass; bad batches are refused; KV sizes agree with plan."""

from __future__ import annotations

import random

import pytest
import torch

from inhouse.engine.models.loader import load_model
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sequence import Sequence
from inhouse.plan.capacity import kv_bytes_per_token
from inhouse.plan.spec import spec_from_hf_config

BLOCK = 4


@pytest.fixture(scope="module")
def runner(tiny_qwen3_folder) -> ModelRunner:
    return ModelRunner(
        load_model(tiny_qwen3_folder, dtype="float32"), num_blocks=96, block_size=BLOCK
    )


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(3)
    return [rng.randrange(3, 384) for _ in range(37)]


class Blocks:
    """Hands out distinct, deliberately non-contiguous block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks))
        random.Random(11).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return taken


def _seq(tokens: list[int], blocks: Blocks) -> Sequence:
    seq = Sequence("r", list(tokens), sampling_params=None)
    seq.block_table = blocks.take(-(-len(tokens) // BLOCK))
    return seq


def _one_pass(runner: ModelRunner, tokens: list[int]) -> torch.Tensor:
    seq = _seq(tokens, Blocks(runner.num_blocks))
    return runner.execute([(seq, len(tokens))])[0]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert int(a.argmax()) == int(b.argmax())


def test_chunked_prefill_matches_one_pass(runner, prompt):
    blocks = Blocks(runner.num_blocks)
    seq = _seq(prompt, blocks)
    for n in (10, 1, 16, 10):
        logits = runner.execute([(seq, n)])[0]
        seq.num_computed_tokens += n
        _close(logits, _one_pass(runner, prompt[: seq.num_computed_tokens]))


def test_mixed_batch_of_chunks_and_decodes_matches_each_alone(runner, prompt):
    blocks = Blocks(runner.num_blocks)
    chunked = _seq(prompt, blocks)
    runner.execute([(chunked, 12)])
    chunked.num_computed_tokens = 12
    decoding = _seq(prompt[:20], blocks)
    runner.execute([(decoding, 19)])
    decoding.num_computed_tokens = 19
    fresh = _seq(prompt[5:30], blocks)
    logits = runner.execute([(decoding, 1), (chunked, 13), (fresh, 25)])
    _close(logits[0], _one_pass(runner, prompt[:20]))
    _close(logits[1], _one_pass(runner, prompt[:25]))
    _close(logits[2], _one_pass(runner, prompt[5:30]))


def test_prefix_blocks_computed_by_another_sequence_are_reused(runner, prompt):
    blocks = Blocks(runner.num_blocks)
    owner = _seq(prompt, blocks)
    runner.execute([(owner, len(prompt))])
    shared = 5  # full blocks of the prompt, as a prefix-cache hit would hand out
    other_tokens = [*prompt[: shared * BLOCK], 7, 8, 9, 10, 11, 12]
    other = Sequence("r2", other_tokens, sampling_params=None)
    other.block_table = owner.block_table[:shared] + blocks.take(2)
    other.num_computed_tokens = shared * BLOCK
    logits = runner.execute([(other, len(other_tokens) - shared * BLOCK)])[0]
    _close(logits, _one_pass(runner, other_tokens))


def test_execute_does_not_modify_the_sequence(runner, prompt):
    seq = _seq(prompt, Blocks(runner.num_blocks))
    before = (list(seq.token_ids), seq.num_computed_tokens, list(seq.block_table))
    runner.execute([(seq, 5)])
    assert (seq.token_ids, seq.num_computed_tokens, seq.block_table) == before


@pytest.mark.parametrize(
    ("tokens", "computed", "n", "blocks", "message"),
    [
        (5, 0, 5, 1, "block table too short"),
        (5, 0, 0, 2, "cannot run 0 tokens"),
        (5, 3, 3, 2, "cannot run 3 tokens after 3"),
    ],
)
def test_bad_batch_entries_are_refused(runner, tokens, computed, n, blocks, message):
    seq = Sequence("bad", list(range(3, 3 + tokens)), sampling_params=None)
    seq.block_table = list(range(blocks))
    seq.num_computed_tokens = computed
    with pytest.raises(ValueError, match=message):
        runner.execute([(seq, n)])


def test_empty_batch_is_refused(runner):
    with pytest.raises(ValueError, match="at least one"):
        runner.execute([])


@pytest.mark.parametrize(("dtype", "plan_dtype"), [("bfloat16", "bf16"), ("float32", "fp32")])
def test_kv_bytes_per_block_agrees_with_plan(tiny_qwen3_folder, dtype, plan_dtype):
    loaded = load_model(tiny_qwen3_folder, dtype=dtype)
    runner = ModelRunner(loaded, num_blocks=3, block_size=16)
    per_token = kv_bytes_per_token(spec_from_hf_config(loaded.config_dict), plan_dtype)
    assert runner.kv_bytes_per_block == per_token * 16
    assert runner.kv_cache.numel() * runner.kv_cache.element_size() == 3 * runner.kv_bytes_per_block
