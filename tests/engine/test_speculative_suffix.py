"""Suffix decoding's parts: its config in vLLM's spelling, the output history, and the
drafter that fills it as sequences finish and drafts from it."""

from __future__ import annotations

import pytest
from test_scheduler import make_seq

from inhouse.engine.errors import EngineConfigError
from inhouse.engine.sequence import SequenceStatus
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.speculative.factory import make_drafter
from inhouse.engine.speculative.history import MAX_TOKENS, PER_KEY, OutputHistory

REPLY = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def history(max_requests: int = 100, factor: float = 1.0, min_prob: float = 0.1) -> OutputHistory:
    return OutputHistory(max_requests, max_depth=24, factor=factor, min_prob=min_prob)


def test_config_takes_vllm_spelling_and_defaults():
    config = SpeculativeConfig.parse('{"method": "suffix"}')
    assert config.num_speculative_tokens == 16  # the tree depth (24), at most 16
    assert (
        config.suffix_decoding_max_tree_depth,
        config.suffix_decoding_max_cached_requests,
        config.suffix_decoding_max_spec_factor,
        config.suffix_decoding_min_token_prob,
    ) == (24, 10000, 1.0, 0.1)
    shallow = SpeculativeConfig.parse(
        '{"method": "suffix", "suffix_decoding_max_tree_depth": 6, '
        '"suffix_decoding_max_spec_factor": 0.5}'
    )
    assert (shallow.num_speculative_tokens, shallow.suffix_decoding_max_spec_factor) == (6, 0.5)
    assert shallow.describe() == "suffix, up to 6 tokens, matches up to 6, the last 10000 outputs"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8}', "belongs"),
        ('{"method": "suffix", "prompt_lookup_min": 2}', "does not belong"),
        ('{"method": "suffix", "model": "/m"}', "does not belong"),
        ('{"method": "suffix", "suffix_decoding_max_tree_depth": 2}', "max_tree_depth"),
        ('{"method": "suffix", "suffix_decoding_max_tree_depth": "x"}', "max_tree_depth"),
        ('{"method": "suffix", "suffix_decoding_max_cached_requests": -1}', "cached_requests"),
        ('{"method": "suffix", "suffix_decoding_max_spec_factor": 0}', "above 0"),
        ('{"method": "suffix", "suffix_decoding_max_spec_factor": NaN}', "spec_factor"),
        ('{"method": "suffix", "suffix_decoding_min_token_prob": 1.5}', "min_token_prob"),
        ('{"method": "suffix", "num_speculative_tokens": 17}', "num_speculative_tokens"),
    ],
)
def test_config_refuses_what_cannot_work(text, words):
    with pytest.raises(EngineConfigError, match=words):
        SpeculativeConfig.parse(text)


def test_history_drafts_what_followed_the_match_capped_by_its_length_and_k():
    kept = history()
    kept.add([1, 2, *REPLY])
    # the sequence ends in 10 11 12 13 (a 4-token match): 4 tokens after it, not more
    assert kept.draft([7, 10, 11, 12, 13], k=16) == (4, [14, 15, 16, 17])
    # ends in 2 10 11 12 13 (5 long): 5 tokens; k caps it
    assert kept.draft([2, 10, 11, 12, 13], k=16) == (5, [14, 15, 16, 17, 18])
    assert kept.draft([2, 10, 11, 12, 13], k=2) == (5, [14, 15])
    assert kept.draft([9, 9, 10, 11, 12], k=16) == (0, [])  # no output holds 9 10 11 12
    assert kept.draft([2, 10, 11, 12, 13], k=16, longer_than=5) == (0, [])
    half = history(factor=0.5)
    half.add(REPLY)
    assert half.draft([10, 11, 12, 13], k=16) == (4, [14, 15])


def test_the_longest_match_drafts_and_places_agreeing_outweigh_the_most_recent():
    kept = history()
    kept.add([5, 6, 10, 11, 12, 13, 40, 41, 42, 43])
    kept.add([9, 10, 11, 12, 13, 50, 51, 52, 53])  # more recent, but a shorter match below
    assert kept.draft([6, 10, 11, 12, 13], k=3) == (5, [40, 41, 42])
    kept.add([8, 10, 11, 12, 13, 40, 41, 42, 60])
    # three places match 4 long: two of them go on with 40 41 42 (the third, the older
    # 50), then part, and the tie goes to the most recent (60)
    assert kept.draft([7, 10, 11, 12, 13], k=4) == (4, [40, 41, 42, 60])
    strict = history(min_prob=0.5)
    for output in ([1, 10, 11, 12, 13, 70, 71], [2, 10, 11, 12, 13, 80, 81]):
        strict.add(output)
    # two places disagree at once: 1/2 is not below 0.5, so the most recent one's token
    assert strict.draft([3, 10, 11, 12, 13], k=4) == (4, [80, 81])
    stricter = history(min_prob=0.6)
    stricter.add([1, 10, 11, 12, 13, 70, 71])
    stricter.add([2, 10, 11, 12, 13, 80, 81])
    assert stricter.draft([3, 10, 11, 12, 13], k=4) == (4, [])


def test_history_keeps_its_last_outputs_and_leaves_out_what_it_cannot_index():
    kept = history(max_requests=2)
    kept.add([1, *REPLY])
    kept.add([100, 101, 102, 103, 104, 105])
    kept.add([200, 201, 202, 203, 204, 205])
    assert len(kept) == 2 and kept.num_tokens == 12
    assert kept.draft([10, 11, 12, 13], k=4) == (0, [])  # the first output left
    assert kept.draft([100, 101, 102, 103], k=4) == (4, [104, 105])
    kept.add([1, 2, 3])  # no window to index
    kept.add([1 << 20, 2, 3, 4, 5, 6])  # an id too large to pack
    assert len(kept) == 2
    assert kept.draft([1 << 21, 1, 2, 3], k=4) == (0, [])
    salted = history(max_requests=1)
    salted.add(REPLY, salt="a")
    assert salted.draft([10, 11, 12, 13], k=2, salt="a") == (4, [14, 15])
    assert salted.draft([10, 11, 12, 13], k=2) == (0, [])  # another salt's (none's) outputs
    salted.add([100, 101, 102, 103, 104], salt="b")  # "a"'s only output leaves
    assert salted.draft([10, 11, 12, 13], k=2, salt="a") == (0, []) and len(salted) == 1
    none = history(max_requests=0)
    none.add(REPLY)
    assert len(none) == 0
    huge = history()
    huge.add(list(range(MAX_TOKENS + 50)))
    assert huge.num_tokens == MAX_TOKENS


def test_a_window_keeps_its_most_recent_places_and_an_evicted_output_leaves_its_windows():
    capped = history(min_prob=0.0)
    capped.add([7, 7, 7, 1, 2, 3, 4, 50])  # the longest match, soon past the window's cap
    for i in range(PER_KEY):
        capped.add([9, 1, 2, 3, 4, 60 + i])
    assert capped.draft([7, 7, 7, 1, 2, 3, 4], k=1) == (4, [60 + PER_KEY - 1])
    shared = history(max_requests=1)
    shared.add([1, 2, 3, 4, 5, 6])
    shared.add([1, 2, 3, 4, 8, 9])  # the first leaves; its place under 1 2 3 4 with it
    assert shared.draft([1, 2, 3, 4], k=2) == (4, [8, 9])


def test_the_drafter_learns_from_finished_sequences_and_keeps_each_salts_apart():
    config = SpeculativeConfig.parse('{"method": "suffix", "disable_by_batch_size": 1}')
    drafter = make_drafter(config, None, None, 0)
    first, busy = make_seq(2, "a", max_tokens=40), make_seq(2, "b")
    first.token_ids += REPLY
    # two decode: no drafts (the batch-size gate), but both are followed to their end
    assert drafter.propose([(first, 30), (busy, 30)], step=0) == {}
    first.status = SequenceStatus.FINISHED
    drafter.keep_only([busy])
    assert drafter.history is not None and len(drafter.history) == 1
    later = make_seq(3, "c", max_tokens=40)
    later.token_ids += [10, 11, 12, 13, 14]
    assert drafter.propose([(later, 30)], step=1) == {later.seq_id: [15, 16, 17, 18, 19]}
    salted = make_seq(3, "d", max_tokens=40)
    salted.cache_salt = "team-a"
    salted.token_ids += [10, 11, 12, 13, 14]
    # its own text has no match, and the unsalted reply is not for a salted request
    assert drafter.propose([(salted, 30)], step=2) == {}
    salted.token_ids += [7, 8, 9, 10, 11]
    salted.status = SequenceStatus.FINISHED
    drafter.keep_only([])
    assert len(drafter.history) == 2
    # the same salt drafts from it; another salt does not, nor does no salt
    same, other, none = (make_seq(3, name, max_tokens=40) for name in "fgh")
    same.cache_salt, other.cache_salt = "team-a", "team-b"
    for seq in (same, other, none):
        seq.token_ids += [13, 14]
    assert drafter.propose([(same, 30)], step=3) == {same.seq_id: [7, 8, 9, 10, 11]}
    assert drafter.propose([(other, 30)], step=3) == {}
    assert drafter.propose([(none, 30)], step=3) == {none.seq_id: [15, 16, 17, 18, 19]}
    # a sequence's own text still drafts, the longer match winning over the history's
    own = make_seq(2, "e", max_tokens=40)
    own.token_ids = [5, 10, 11, 12, 13, 14, 99, 5, 10, 11, 12, 13, 14]
    assert drafter.propose([(own, 30)], step=4) == {own.seq_id: [99, 5, 10, 11, 12, 13]}
