"""The parts of speculative decoding on their own: the config, prompt lookup, the off-switch,
and the scheduler's handling of a draft's blocks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_scheduler import BS, make_scheduler, make_seq

from inhouse.engine.errors import EngineConfigError
from inhouse.engine.sampler import SampledToken, Sampler
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.sequence import Sequence
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.speculative.drafter import Verified
from inhouse.engine.speculative.factory import make_drafter
from inhouse.engine.speculative.gate import AcceptanceGate
from inhouse.engine.speculative.length import DraftLength
from inhouse.engine.speculative.ngram import NgramProposer
from inhouse.engine.speculative.verify_rows import RoundTokens, state_free


def test_config_takes_vllm_spelling_and_defaults():
    config = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    only_max = SpeculativeConfig.parse('{"num_speculative_tokens": 2, "prompt_lookup_max": 4}')
    assert (only_max.method, only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (
        "ngram",
        4,
        4,
    )
    draft = SpeculativeConfig.parse('{"model": "/m", "num_speculative_tokens": 2}')
    assert draft.method == "draft_model" and draft.model == "/m"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[1]", "JSON object"),
        ("{", "not JSON"),
        ('{"method": "ngram"}', "num_speculative_tokens"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"num_speculative_tokens": 99}', "num_speculative_tokens"),
        ('{"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}', "exceed"),
        ('{"num_speculative_tokens": 2, "method": "eagle"}', "not supported"),
        ('{"num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}', "unknown"),
        ('{"num_speculative_tokens": 2, "min_acceptance_rate": 2}', "min_acceptance_rate"),
        ('{"num_speculative_tokens": 2, "adaptive_length": 1}', "adaptive_length"),
    ],
)
def test_config_refuses_what_cannot_work(text, words):
    with pytest.raises(EngineConfigError, match=words):
        SpeculativeConfig.parse(text)


def test_ngram_takes_the_longest_match_and_its_most_recent_occurrence():
    proposer = NgramProposer(k=3, min_n=1, max_n=3)
    # "7 8 9" occurs at 0 and 6; the suffix "7 8 9" matches 3 long, most recent first.
    tokens = [7, 8, 9, 1, 2, 3, 7, 8, 9, 4, 5, 0, 7, 8, 9]
    assert proposer.propose(tokens) == [4, 5, 0]
    # Only "9" (n=1) recurs: the tokens after its last earlier occurrence.
    assert proposer.propose([9, 1, 2, 3, 9, 4, 5, 9]) == [4, 5, 9]
    assert proposer.propose([1, 2, 3, 4]) == []  # nothing recurs
    assert proposer.propose(tokens, k=1) == [4]


def test_ngram_respects_its_minimum_and_word_alignment():
    assert NgramProposer(k=2, min_n=2, max_n=3).propose([5, 6, 1, 2, 6]) == []
    # 256 = bytes 00 01 00 00: a misaligned byte match must not count as token 1.
    tricky = [256, 0, 1, 9, 8, 1]
    assert NgramProposer(k=2, min_n=1, max_n=1).propose(tricky) == [9, 8]


def test_gate_pauses_a_sequence_whose_drafts_keep_failing_then_tries_again():
    gate = AcceptanceGate(threshold=0.3, window=3, pause=5)
    for step in range(3):
        assert gate.allows(1, step)
        gate.record(1, step, num_drafted=4, num_accepted=0)
        gate.record(2, step, num_drafted=4, num_accepted=3)
    assert not gate.allows(1, 3) and not gate.allows(1, 7)
    assert gate.allows(1, 8)
    assert gate.allows(2, 3) and gate.num_pauses == 1
    gate.forget({2})
    assert gate.allows(1, 4)


def _decoding(sched, prompt_len):
    seq = make_seq(prompt_len, max_tokens=40)
    sched.add([seq])
    out = sched.schedule()
    sched.update(out, lambda rows, _seqs: [SampledToken(5) for _ in rows])
    assert seq.num_computed_tokens == prompt_len and seq.num_tokens == prompt_len + 1
    return seq


def test_rejected_draft_tokens_give_their_blocks_back_and_are_never_hashed():
    sched = make_scheduler(num_blocks=16)
    seq = _decoding(sched, BS - 2)  # the next token to compute is at BS - 2
    draft = [11, 12, 13, 14, 15, 16]  # reaches into the third block
    out = sched.schedule({seq.seq_id: draft})
    assert out.scheduled == [(seq, 7)] and out.drafts == {0: draft}
    assert len(seq.block_table) == sched.kv_cache.blocks_for_tokens(BS + 5) == 3
    # The target agrees with the first two draft tokens, then says 99.
    picks = iter([11, 12, 99])
    news, verified = sched.update(out, lambda rows, _seqs: [SampledToken(next(picks))])
    assert [n.token_id for _, n in news] == [11, 12, 99]
    assert verified[0].num_drafted == 6 and verified[0].num_accepted == 2
    assert seq.output_token_ids == [5, 11, 12, 99]
    assert seq.num_computed_tokens == seq.num_tokens - 1 == BS + 1
    assert len(seq.block_table) == 2  # covers the computed tokens, nothing past them
    assert sched.kv_cache.num_free_blocks == 16 - 2
    first, second = (sched.kv_cache.pool.blocks[b] for b in seq.block_table)
    assert first.block_hash is not None and second.block_hash is None


def test_a_fully_accepted_draft_gets_a_bonus_token_and_hashes_its_full_block():
    sched = make_scheduler(num_blocks=16)
    seq = _decoding(sched, BS - 3)
    out = sched.schedule({seq.seq_id: [21, 22, 23]})
    picks = iter([21, 22, 23, 24])
    news, verified = sched.update(out, lambda rows, _seqs: [SampledToken(next(picks))])
    assert [n.token_id for _, n in news] == [21, 22, 23, 24]
    assert verified[0].num_accepted == 3
    assert seq.num_computed_tokens == BS + 1
    assert sched.kv_cache.pool.blocks[seq.block_table[0]].block_hash is not None


def test_a_draft_is_cut_to_the_step_budget_and_a_finish_ends_verification():
    sched = make_scheduler(num_blocks=16, budget=3)
    seq = _decoding(sched, 2)
    out = sched.schedule({seq.seq_id: [1, 2, 3, 4]})
    assert out.scheduled == [(seq, 3)] and out.drafts == {0: [1, 2]}
    eos = iter([1, 2])  # 2 is the test scheduler's EOS: the sequence stops there
    news, verified = sched.update(out, lambda rows, _seqs: [SampledToken(next(eos))])
    assert seq.finish_reason == "stop" and [n.token_id for _, n in news] == [1, 2]
    assert verified[0].num_accepted == 2
    assert sched.kv_cache.num_free_blocks == 16


def test_the_drafter_stops_drafting_for_a_sequence_whose_drafts_fail_and_counts_them():
    config = SpeculativeConfig(
        num_speculative_tokens=3,
        prompt_lookup_min=1,
        prompt_lookup_max=2,
        min_acceptance_rate=0.5,
        acceptance_window=2,
        pause_steps=3,
        adaptive_length=False,  # the gate alone: every draft as long as the lookup allows
    )
    drafter = make_drafter(config, None, None, 0)
    seq = make_seq(2, max_tokens=40)
    seq.token_ids = [4, 5, 6, 4, 5, 6, 4]
    assert drafter.propose([(seq, 10)], step=0) == {seq.seq_id: [5, 6, 4]}
    assert drafter.propose([(seq, 2)], step=0) == {seq.seq_id: [5, 6]}  # room caps it
    for step in (0, 1):
        drafter.record([Verified(seq, 3, 1)], step)
    assert drafter.propose([(seq, 10)], step=2) == {}  # 2 of 6 accepted: paused
    assert drafter.propose([(seq, 10)], step=5) == {seq.seq_id: [5, 6, 4]}
    counters = drafter.counters.snapshot()
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (
        2,
        6,
        2,
    )
    assert counters.num_accepted_tokens_per_pos == [2, 0, 0] and counters.num_pauses == 1


def test_no_sequence_drafts_while_more_than_disable_by_batch_size_decode():
    config = SpeculativeConfig(
        num_speculative_tokens=2, prompt_lookup_min=2, disable_by_batch_size=2
    )
    drafter = make_drafter(config, None, None, 0)
    seqs = [make_seq(2, request_id=f"r{i}") for i in range(3)]
    for seq in seqs:
        seq.token_ids = [4, 5, 4, 5]
    assert drafter.propose([(s, 5) for s in seqs], step=0) == {}
    assert drafter.propose([(s, 5) for s in seqs[:2]], step=0) == {
        s.seq_id: [4, 5] for s in seqs[:2]
    }


def test_an_adaptive_draft_length_doubles_after_whole_drafts_and_shrinks_after_rejections():
    length = DraftLength(most=8)  # a draft model's drafts: prompt lookup's follow its match
    lengths = []
    for accepted in [1, 2, 2, 4, 8, 3]:
        drafted = length.of(1)
        lengths.append(drafted)
        length.record(1, drafted, min(accepted, drafted))
    # starts at K; 1 of 8 accepted: 2; whole: 4; 2 of 4: 3; whole: 6; whole: 8 (K)
    assert lengths == [8, 2, 4, 3, 6, 8]
    assert length.of(2) == 8  # another sequence: its own length
    length.forget({2})
    assert length.of(1) == 8


def test_adaptive_prompt_lookup_drafts_as_many_tokens_as_its_match_is_long():
    config = SpeculativeConfig(
        num_speculative_tokens=8, prompt_lookup_min=1, prompt_lookup_max=16, adaptive_length=True
    )
    drafter = make_drafter(config, None, None, 0)
    seq = make_seq(2)
    passage = list(range(10, 30))
    seq.token_ids = [*passage, 7, *passage[:3]]  # "10 11 12" recurs: a 3-gram
    assert drafter.propose([(seq, 100)], 0) == {seq.seq_id: [13, 14, 15]}
    seq.token_ids = [*passage, 7, *passage[:12]]  # a 12-gram: K (8) caps the draft
    assert drafter.propose([(seq, 100)], 1) == {seq.seq_id: passage[12:20]}
    seq.token_ids = [5, *passage, 7, 5]  # a 1-gram earns one token
    assert drafter.propose([(seq, 100)], 2) == {seq.seq_id: [10]}
    fixed = make_drafter(replace(config, adaptive_length=False), None, None, 0)
    assert fixed.propose([(seq, 100)], 3) == {seq.seq_id: passage[:8]}


def test_a_state_free_draft_is_sampled_in_one_call_a_penalised_one_round_by_round():
    """Greedy rows without state are all sampled at the first round, with the tokens each
    round would have drawn; a penalised sequence's rows are asked for one round at a time."""
    logits = torch.randn(7, 50, generator=torch.Generator().manual_seed(0))
    sampler, calls = Sampler(seed=0), []

    def sample(rows: list[int], seqs: list) -> list:
        calls.append(rows)
        return sampler(logits[rows].clone(), seqs, {0})

    free = Sequence("a", [1, 2], SamplingParams(temperature=0))
    penalised = Sequence("b", [1, 2], SamplingParams(temperature=0, repetition_penalty=1.3))
    seqs = {0: free, 1: penalised}
    rounds = RoundTokens(sample, [0, 4], {0: [9, 9, 9], 1: [9, 9]}, seqs.__getitem__)
    first = rounds([(0, 0), (1, 0)])
    assert calls == [[0, 1, 2, 3, 4]]
    assert rounds([(0, 1), (1, 1)])[0].token_id == logits[1].argmax().item()
    assert calls[-1] == [5]
    assert first[0].token_id == logits[0].argmax().item()
    assert not state_free(Sequence("c", [1, 2], SamplingParams(temperature=0, logprobs=2)))
    assert not state_free(Sequence("d", [1, 2], SamplingParams(temperature=0, min_tokens=3)))
    assert not state_free(Sequence("e", [1, 2], SamplingParams(temperature=0.7)))
