"""SamplingParams validation and the batched sampler's semantics."""

from __future__ import annotations

import pytest
import torch

from inhouse.engine.errors import EngineInputError
from inhouse.engine.sampler import Sampler, argmax_rows
from inhouse.engine.sampling_params import InvalidSamplingParams, SamplingParams
from inhouse.engine.sequence import Sequence

VOCAB = 32
EOS = 0


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        ({"n": 0}, "n", "at least 1"),
        ({"temperature": -0.1}, "temperature", ">= 0"),
        ({"temperature": float("nan")}, "temperature", "finite"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": 0}, "top_k", "-1"),
        ({"top_k": -2}, "top_k", "-1"),
        ({"min_p": 1.2}, "min_p", "[0, 1]"),
        ({"presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -2.5}, "frequency_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "> 0"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"min_tokens": -1}, "min_tokens", ">= 0"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens", "must not exceed"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"logprobs": -1}, "logprobs", "[0, 20]"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"stop_token_ids": [-3]}, "stop_token_ids", "non-negative"),
    ],
)
def test_invalid_values_raise_clear_errors(kwargs: dict, param: str, words: str) -> None:
    with pytest.raises(InvalidSamplingParams, match=None) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, EngineInputError) and isinstance(info.value, ValueError)
    assert info.value.param == param
    assert words in str(info.value)


def test_single_stop_string_becomes_a_list() -> None:
    assert SamplingParams(stop="###").stop == ["###"]


def make_seq(params: SamplingParams, output: list[int] = (), index: int = 0) -> Sequence:
    seq = Sequence("r", [5, 6, 7], params, index=index)
    seq.token_ids.extend(output)
    return seq


def logits_for(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def sample(logits: torch.Tensor, seqs: list[Sequence], sampler: Sampler | None = None):
    return (sampler or Sampler(seed=0))(logits.clone(), seqs, {EOS})


def test_greedy_rows_take_the_argmax() -> None:
    logits = logits_for(4)
    seqs = [make_seq(SamplingParams(temperature=0)) for _ in range(4)]
    assert [t.token_id for t in sample(logits, seqs)] == logits.argmax(-1).tolist()


def test_argmax_rows_picks_as_torch_argmax_does() -> None:
    """The first of tied maxima, NaN as the largest, all -inf or +inf rows, strided views,
    and float64 or bfloat16 rows (torch's own path) all give torch.argmax's index."""
    inf, nan = float("inf"), float("nan")
    rows = torch.tensor(
        [[1.0, 3.0, 3.0, 2.0], [-inf] * 4, [1.0, nan, 5.0, nan], [inf, 1.0, inf, 0.0]]
    )
    wide = torch.randn(6, 49152, generator=torch.Generator().manual_seed(1))
    wide[2, 17], wide[2, 40000] = 50.0, 50.0
    for values in (rows, wide, wide[::2], wide[:, ::3], wide.double(), wide.bfloat16()):
        assert torch.equal(argmax_rows(values), values.argmax(dim=-1))


def test_seeded_row_draws_the_same_tokens_whatever_its_neighbours() -> None:
    def run(neighbours: int, steps: int = 8) -> list[int]:
        seeded = make_seq(SamplingParams(temperature=1.0, seed=42))
        others = [
            make_seq(SamplingParams(temperature=0.7, seed=None if i % 2 else i))
            for i in range(neighbours)
        ]
        sampler = Sampler(seed=neighbours)
        tokens = []
        for step in range(steps):
            logits = torch.cat([logits_for(1, step), logits_for(neighbours, 100 + step)])
            out = sampler(logits, [seeded, *others], {EOS})
            tokens.append(out[0].token_id)
        return tokens

    alone = run(0)
    assert run(5) == alone and run(11) == alone
    assert len(set(alone)) > 1


def test_siblings_with_one_seed_use_independent_generators() -> None:
    params = SamplingParams(temperature=1.5, seed=7)
    a, b = make_seq(params, index=0), make_seq(params, index=1)
    sampler = Sampler()
    draws_a, draws_b = [], []
    for step in range(10):
        row = logits_for(1, step)
        out = sampler(torch.cat([row, row]), [a, b], {EOS})
        draws_a.append(out[0].token_id)
        draws_b.append(out[1].token_id)
    assert draws_a != draws_b


def test_sampling_follows_the_softmax_distribution() -> None:
    row = torch.tensor([[2.0, 1.0, 0.0, -1.0] + [-30.0] * (VOCAB - 4)])
    rows = 6000
    seqs = [make_seq(SamplingParams(temperature=1.0)) for _ in range(rows)]
    tokens = torch.tensor([t.token_id for t in sample(row.expand(rows, VOCAB), seqs)])
    freq = torch.bincount(tokens, minlength=VOCAB)[:4].float() / rows
    expected = torch.softmax(row[0, :4], -1)
    assert torch.allclose(freq, expected, atol=0.03)


def test_top_k_top_p_and_min_p_truncate() -> None:
    row = torch.tensor([[3.0, 2.9, 2.8, 0.0] + [-30.0] * (VOCAB - 4)])
    rows = 400
    for params, allowed in [
        (SamplingParams(temperature=5.0, top_k=1), {0}),
        (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (SamplingParams(temperature=1.0, top_p=0.3), {0}),
        (SamplingParams(temperature=1.0, top_p=0.6), {0, 1}),
        (SamplingParams(temperature=1.0, min_p=0.5), {0, 1, 2}),
    ]:
        seqs = [make_seq(params) for _ in range(rows)]
        got = {t.token_id for t in sample(row.expand(rows, VOCAB), seqs)}
        assert got == allowed, params


def test_penalties_follow_vllm_semantics() -> None:
    row = torch.zeros(1, VOCAB)
    row[0, 5] = 2.0  # a prompt token
    row[0, 9] = 2.1  # an output token, twice
    row[0, 3] = 1.9
    rep = make_seq(SamplingParams(temperature=0, repetition_penalty=2.0), output=[9, 9])
    assert sample(row, [rep])[0].token_id == 3  # 5 and 9 halved
    freq = make_seq(SamplingParams(temperature=0, frequency_penalty=0.2), output=[9, 9])
    assert sample(row, [freq])[0].token_id == 5  # 9 loses 0.4; prompt token 5 untouched
    presence = make_seq(SamplingParams(temperature=0, presence_penalty=0.05), output=[9, 9])
    assert sample(row, [presence])[0].token_id == 9  # loses only 0.05


def test_min_tokens_bans_eos_and_stop_token_ids() -> None:
    row = torch.zeros(1, VOCAB)
    row[0, EOS] = 10.0
    row[0, 4] = 9.0
    row[0, 8] = 1.0
    early = make_seq(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4]))
    assert sample(row, [early])[0].token_id == 8
    done = make_seq(SamplingParams(temperature=0, min_tokens=2), output=[8, 8])
    assert sample(row, [done])[0].token_id == EOS


def test_logprobs_are_raw_and_top_sorted() -> None:
    logits = logits_for(2)
    seqs = [
        make_seq(SamplingParams(temperature=0, logprobs=3, repetition_penalty=1.5)),
        make_seq(SamplingParams(temperature=0, logprobs=0)),
    ]
    out = sample(logits, seqs)
    raw = torch.log_softmax(logits, -1)
    assert out[0].logprob == pytest.approx(float(raw[0, out[0].token_id]))
    assert [t for t, _ in out[0].top] == raw[0].topk(3).indices.tolist()
    assert out[1].top is None and out[1].logprob == pytest.approx(float(raw[1].max()))


class BanAllBut:
    """A guide that allows one token; terminated after accepting it."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.done = False

    def mask_logits(self, logits_row: torch.Tensor) -> None:
        keep = logits_row[self.token].clone()
        logits_row.fill_(float("-inf"))
        logits_row[self.token] = keep

    def accept(self, token_id: int) -> None:
        self.done = token_id == self.token

    def is_terminated(self) -> bool:
        return self.done


def test_guide_masks_its_row_only() -> None:
    logits = logits_for(2)
    guided = make_seq(SamplingParams(temperature=1.0))
    guided.guide = BanAllBut(17)
    free = make_seq(SamplingParams(temperature=0))
    out = sample(logits, [guided, free])
    assert out[0].token_id == 17
    assert out[1].token_id == int(logits[1].argmax())


def test_large_vocab_truncation_exact_inside_candidates_and_falls_back_outside() -> None:
    vocab = 1000
    peaky = torch.full((1, vocab), -10.0)
    peaky[0, 500:503] = torch.tensor([5.0, 4.9, 4.8])
    rows = 300
    seqs = [make_seq(SamplingParams(temperature=1.0, top_p=0.6)) for _ in range(rows)]
    assert {t.token_id for t in sample(peaky.expand(rows, vocab), seqs)} == {500, 501}
    flat = torch.zeros(2000, vocab)  # the nucleus of top_p 0.5 holds 500 tokens
    seqs = [make_seq(SamplingParams(temperature=1.0, top_p=0.5, seed=i)) for i in range(2000)]
    drawn = {t.token_id for t in sample(flat, seqs)}
    assert 400 < len(drawn) <= 500
