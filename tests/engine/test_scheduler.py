"""Scheduler decisions and the step's aftermath, driven through the real ``schedule`` and
``update`` (the model is out of the loop: every sampled token is given here), and a state
machine over add / step / abort / finish that checks the block accounting after every step."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampler import SampledToken
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler, SchedulerOutput
from inhouse.engine.sequence import Sequence, SequenceStatus

BS = 4
EOS = 2


def make_scheduler(
    num_blocks: int = 64,
    max_num_seqs: int = 8,
    budget: int = 64,
    max_model_len: int = 1000,
    kv_reserve: float = 1.0,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS)
    return Scheduler(kv, max_num_seqs, budget, max_model_len, {EOS}, kv_reserve)


def make_seq(
    prompt_len: int, request_id: str = "r", index: int = 0, n: int = 1, max_tokens: int = 16
) -> Sequence:
    tokens = [3 + (7 * len(request_id) + i) % 50 for i in range(prompt_len)]
    return Sequence(request_id, tokens, SamplingParams(n=n, max_tokens=max_tokens), index=index)


def step(sched: Scheduler, token: int = 1) -> SchedulerOutput:
    """One engine step, model out of the loop: every caught-up sequence samples ``token``."""
    out = sched.schedule()
    sched.update(out, lambda rows, _seqs: [SampledToken(token) for _ in rows])
    return out


def test_running_first_then_waiting_under_one_token_budget():
    sched = make_scheduler(budget=10)
    a, b = make_seq(6, "a"), make_seq(6, "b")
    sched.add([a])
    sched.add([b])
    out = step(sched)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 6), ("b", 4)]  # b chunked
    out = step(sched)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 2)]
    out = step(sched)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 1)]


def test_long_prompt_is_prefilled_in_chunks():
    sched = make_scheduler(budget=8)
    seq = make_seq(30)
    sched.add([seq])
    chunks = [step(sched).num_tokens for _ in range(4)]
    assert chunks == [8, 8, 8, 6]
    assert seq.num_output_tokens == 1


def test_max_num_seqs_limits_admission():
    sched = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        sched.add([make_seq(3, rid)])
    step(sched)
    assert len(sched.running) == 2 and len(sched.waiting) == 1


def test_out_of_blocks_preempts_newest_running_and_requeues_it_first():
    sched = make_scheduler(num_blocks=4, budget=64, kv_reserve=0.0)
    old, new = make_seq(4, "old"), make_seq(4, "new")
    sched.add([old])
    sched.add([new])
    step(sched)  # both prefill: 2 blocks used; each then holds 5 tokens
    waiting = make_seq(2, "w")
    sched.add([waiting])
    step(sched)  # both decode into a second block: pool full, waiting not admitted
    assert sched.kv_cache.num_free_blocks == 0
    for _ in range(3):
        step(sched)
    out = step(sched)  # old needs a third block: new is preempted
    assert [s.request_id for s in out.preempted] == ["new"]
    assert new.status is SequenceStatus.WAITING and new.block_table == []
    assert new.num_computed_tokens == 0
    assert list(sched.waiting)[:2] == [new, waiting]
    assert sched.num_preemptions == 1
    assert [s.request_id for s, _ in out.scheduled] == ["old"]  # no admission this step
    assert sched.kv_cache.counters.queries == 8  # only admitted lookups count, once each


def test_single_request_always_progresses_when_pool_holds_max_model_len():
    sched = make_scheduler(num_blocks=5, budget=6, max_model_len=20)  # 20 slots
    seq = make_seq(9)
    sched.add([seq])
    for _ in range(40):
        if seq.is_finished:
            break
        step(sched)
    assert seq.num_tokens == 20 and seq.finish_reason == "length"
    assert sched.num_preemptions == 0 and sched.kv_cache.num_free_blocks == 5


def test_preempted_sequence_recomputes_from_prefix_cache_and_continues():
    sched = make_scheduler(num_blocks=6, budget=64, kv_reserve=0.0)
    a, b = make_seq(8, "a"), make_seq(8, "bb")
    sched.add([a])
    sched.add([b])
    while not sched.num_preemptions:
        step(sched)
    tokens_before = list(b.token_ids)
    sched.finish(a, "length")
    out = step(sched)
    [(seq, n)] = out.scheduled
    assert seq is b and b.num_cached_tokens == 0  # first admission had no hit
    assert b.num_computed_tokens == len(tokens_before)
    assert n < len(tokens_before)  # full blocks came back from the prefix cache
    assert b.token_ids[: len(tokens_before)] == tokens_before


def test_siblings_wait_for_leader_prompt_then_share_its_blocks():
    sched = make_scheduler(budget=64)
    seqs = [make_seq(10, "r", index=i, n=3) for i in range(3)]
    sched.add(seqs)
    out = step(sched)
    assert [s.index for s, _ in out.scheduled] == [0]
    out = step(sched)
    assert sorted(s.index for s, _ in out.scheduled) == [0, 1, 2]
    shared = seqs[0].block_table[:2]
    for sibling in seqs[1:]:
        assert sibling.block_table[:2] == shared
        assert sibling.block_table[2] != seqs[0].block_table[2]
    assert all(sched.kv_cache.pool.blocks[i].ref_cnt == 3 for i in shared)


def test_finish_and_preemption_return_every_block():
    sched = make_scheduler(num_blocks=10, budget=16, kv_reserve=0.0)
    seqs = [make_seq(5 + i, f"r{i}", max_tokens=6) for i in range(6)]
    for seq in seqs:
        sched.add([seq])
    for _ in range(30):
        step(sched)
    for seq in seqs:
        sched.finish_request(seq.request_id, "abort")
    assert not sched.has_unfinished() and not sched.running and not sched.waiting
    assert sched.kv_cache.num_free_blocks == 10
    assert all(b.ref_cnt == 0 for b in sched.kv_cache.pool.blocks)
    assert sched.num_preemptions > 0


def test_update_finishes_on_eos_stop_token_and_length_after_min_tokens():
    sched = make_scheduler()
    eos = Sequence("e", [5, 6, 7], SamplingParams(max_tokens=10, min_tokens=2))
    stop = Sequence(
        "s", [5, 6, 7], SamplingParams(max_tokens=10, stop_token_ids=[9], ignore_eos=True)
    )
    length = Sequence("l", [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    for seq in (eos, stop, length):
        sched.add([seq])
    step(sched, token=EOS)  # below min_tokens for "e": EOS is just a token; the others ignore it
    assert not eos.is_finished and not stop.is_finished and not length.is_finished
    step(sched, token=EOS)
    assert (eos.finish_reason, eos.stop_reason) == ("stop", None)
    assert (length.finish_reason, length.num_output_tokens) == ("length", 2)
    step(sched, token=9)
    assert (stop.finish_reason, stop.stop_reason) == ("stop", 9)
    assert stop.output_token_ids == [EOS, EOS, 9]
    assert not sched.has_unfinished() and sched.kv_cache.num_free_blocks == 64
    assert sched.finished_requests == {"stop": 2, "length": 1}


class RaisingGuide:
    """A grammar whose matcher raises on the second token it is given."""

    def __init__(self) -> None:
        self.accepted = 0

    def mask_logits(self, logits_row: object) -> None:
        pass

    def accept(self, token_id: int) -> None:
        self.accepted += 1
        if self.accepted == 2:
            raise ValueError("matcher state corrupted")

    def is_terminated(self) -> bool:
        return False


def test_a_sequence_that_raises_in_update_fails_its_request_and_the_rest_go_on():
    sched = make_scheduler()
    bad = [make_seq(5, "bad", index=i, n=2) for i in range(2)]
    bad[0].guide = RaisingGuide()
    good = make_seq(5, "good", max_tokens=4)
    sched.add(bad)
    sched.add([good])
    news = []
    for _ in range(6):
        out = sched.schedule()
        news += sched.update(out, lambda rows, _seqs: [SampledToken(1) for _ in rows])[0]
    errors = [out for seq, out in news if out.error is not None]
    assert len(errors) == 1 and "matcher state corrupted" in errors[0].error
    assert all(seq.finish_reason == "error" for seq in bad)
    assert good.finish_reason == "length" and good.num_output_tokens == 4
    assert sched.finished_requests == {"error": 1, "length": 1}
    assert sched.kv_cache.num_free_blocks == 64


def test_admission_reserves_what_running_sequences_need_to_finish():
    """10 blocks of 4; each request needs 4 blocks to reach 4 + 12 tokens: two run at once."""
    for reserve, most, preempted in ((1.0, 2, False), (0.0, 4, True)):
        sched = make_scheduler(num_blocks=10, kv_reserve=reserve)
        seqs = [make_seq(4, f"r{i}", max_tokens=12) for i in range(4)]
        for seq in seqs:
            sched.add([seq])
        running = 0
        while sched.has_unfinished():
            step(sched)
            running = max(running, len(sched.running))
        assert running == most and (sched.num_preemptions > 0) == preempted
        assert all(s.num_output_tokens == 12 for s in seqs)


class SchedulerMachine(RuleBasedStateMachine):
    """Random add / step / abort / finish: after every one, each block's ref count equals
    the number of live sequences holding it, free blocks are exactly the unheld ones, and
    with a full reserve nothing is ever preempted."""

    @initialize(reserve=st.sampled_from([0.0, 0.5, 1.0]))
    def start(self, reserve: float) -> None:
        self.sched = make_scheduler(
            num_blocks=16, max_num_seqs=4, budget=12, max_model_len=40, kv_reserve=reserve
        )
        self.requests: list[list[Sequence]] = []
        self.count = 0

    @rule(
        prompt=st.lists(st.integers(3, 5), min_size=1, max_size=24),
        n=st.integers(1, 3),
        max_tokens=st.integers(1, 12),
    )
    def add(self, prompt: list[int], n: int, max_tokens: int) -> None:
        self.count += 1
        params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=False)
        seqs = [Sequence(f"q{self.count}", list(prompt), params, index=i) for i in range(n)]
        self.sched.add(seqs)
        self.requests.append(seqs)

    @rule(token=st.sampled_from([1, 3, 4, EOS]))
    def step(self, token: int) -> None:
        step(self.sched, token)

    @precondition(lambda self: self.live_requests())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seqs = data.draw(st.sampled_from(self.live_requests()))
        self.sched.finish_request(seqs[0].request_id, "abort")

    @precondition(lambda self: self.live_requests())
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        seqs = data.draw(st.sampled_from(self.live_requests()))
        live = [s for s in seqs if not s.is_finished]
        self.sched.finish(data.draw(st.sampled_from(live)), "stop", "a stop string")

    def live_requests(self) -> list[list[Sequence]]:
        return [seqs for seqs in self.requests if not all(s.is_finished for s in seqs)]

    @invariant()
    def ref_counts_equal_holders_and_nothing_leaks(self) -> None:
        if not hasattr(self, "sched"):
            return
        pool = self.sched.kv_cache.pool
        holders = [0] * pool.num_blocks
        for seqs in self.requests:
            for seq in seqs:
                if seq.is_finished:
                    assert seq.block_table == []
                for block_id in seq.block_table:
                    holders[block_id] += 1
        assert [b.ref_cnt for b in pool.blocks] == holders
        free = sorted(b.block_id for b in pool.free_queue)
        assert free == [i for i, n in enumerate(holders) if n == 0]
        assert pool.num_free == len(free)
        live = {s.seq_id for seqs in self.live_requests() for s in seqs if not s.is_finished}
        queued = [s.seq_id for s in (*self.sched.running, *self.sched.waiting)]
        assert sorted(queued) == sorted(live)
        if self.sched.kv_reserve == 1.0:
            assert self.sched.num_preemptions == 0

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for seqs in self.requests:
            self.sched.finish_request(seqs[0].request_id, "abort")
        assert not self.sched.has_unfinished()
        assert self.sched.kv_cache.num_free_blocks == self.sched.kv_cache.pool.num_blocks


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
