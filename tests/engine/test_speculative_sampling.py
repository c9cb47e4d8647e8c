"""Under sampling, verifying a draft keeps the target distribution (the rejection rule).

Many sequences decode at once with a two-token draft over a small vocabulary whose
distributions are fixed: ``P0`` after the last token, ``P1`` after the first draft token,
``P2`` after the second. The real ``Scheduler.update`` and ``Sampler`` verify the drafts.
Each emitted token must follow the target: the first ~ ``P0``; the second, given the first
was the draft's, ~ ``P1``; the third ~ ``P2``. With 30,000 sequences the first token is
seen 30,000 times, the second ~19,500 and the third ~9,750, so a frequency's standard
error is at most 0.0044 and the 4-sigma bound below fails for a 2 % shift in any token's
probability (the test checks that the bound is that tight).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from test_scheduler import make_scheduler, make_seq

from inhouse.engine.sampler import SampledToken, Sampler

pytestmark = pytest.mark.slow

P0 = [0.65, 0.2, 0.1, 0.05]
P1 = [0.1, 0.3, 0.5, 0.1]
P2 = [0.25, 0.25, 0.25, 0.25]
DRAFT = [0, 2]  # the draft's tokens: likely at position 0, the mode at position 1
VOCAB = 8  # tokens 4..7 have probability 0 (token 2 is the test scheduler's EOS: ignored)
BATCH, BATCHES = 1000, 30


def _logits(probs: list[float]) -> torch.Tensor:
    row = torch.full((VOCAB,), float("-inf"))
    row[: len(probs)] = torch.tensor(probs).log()
    return row


def _verify_one_batch(sampler: Sampler) -> list[list[int]]:
    sched = make_scheduler(num_blocks=BATCH * 3, max_num_seqs=BATCH, budget=BATCH * 4)
    seqs = [make_seq(2, request_id=f"r{i}", max_tokens=10) for i in range(BATCH)]
    for seq in seqs:
        seq.sampling_params.temperature = 1.0
        seq.sampling_params.ignore_eos = True
        sched.add([seq])
    out = sched.schedule()
    sched.update(out, lambda rows, _seqs: [SampledToken(7) for _ in rows])
    plan = sched.schedule({seq.seq_id: list(DRAFT) for seq in seqs})
    assert len(plan.drafts) == BATCH
    rows = torch.stack([_logits(p) for p in (P0, P1, P2)] * BATCH)
    _, verified = sched.update(plan, lambda r, s: sampler(rows[r], s, ()))
    assert len(verified) == BATCH
    return [seq.output_token_ids[1:] for seq in seqs]


def _assert_follows(counts: Counter, total: int, probs: list[float]) -> None:
    for token, p in enumerate(probs):
        observed = counts[token] / total
        sigma = math.sqrt(p * (1 - p) / total)
        assert abs(observed - p) < 4 * sigma, (token, observed, p)
        assert 4 * sigma < 0.02, "too few samples to see a 2 % shift"
    assert sum(counts[t] for t in range(len(probs))) == total


def test_verified_drafts_emit_tokens_with_the_target_distribution():
    sampler = Sampler(seed=1234)
    outputs = [tokens for _ in range(BATCHES) for tokens in _verify_one_batch(sampler)]
    first = Counter(tokens[0] for tokens in outputs)
    _assert_follows(first, len(outputs), P0)
    after_draft = [tokens for tokens in outputs if tokens[0] == DRAFT[0]]
    second = Counter(tokens[1] for tokens in after_draft)
    _assert_follows(second, len(after_draft), P1)
    both = [tokens for tokens in after_draft if tokens[1] == DRAFT[1]]
    third = Counter(tokens[2] for tokens in both)
    _assert_follows(third, len(both), P2)
    # A rejected token is the last of its step; an accepted one is followed by another.
    assert all(len(t) == 1 for t in outputs if t[0] != DRAFT[0])
    assert all(len(t) == 3 for t in both)
