"""The batched sampler: one logits row per sequence in, one token per sequence out.

Work is batched across rows; only rows that need it pay for per-row steps
(guides, penalties, min_tokens bans, seeded generators). Greedy rows take one
argmax. Sampling draws by the exponential race ``argmax(p / q)``, ``q ~ Exp(1)``,
which lets each seeded row draw its noise from its own ``torch.Generator`` so its
tokens do not depend on its neighbours in the batch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from inhouse.engine.sampling import SamplingParams
from inhouse.engine.sequence import Sequence


@dataclass(slots=True)
class SampledToken:
    """One sampled token, with its raw logprob and top alternatives when asked for."""

    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


class Sampler:
    """Picks the next token of every sequence of a step in one batched pass."""

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    @torch.inference_mode()
    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: Collection[int]
    ) -> list[SampledToken]:
        params = [seq.sampling_params for seq in seqs]
        raw_logprobs = self._raw_logprobs(logits, params)
        self._adjust_rows(logits, seqs, eos_token_ids)
        token_ids = self._choose(logits, seqs)
        return self._with_logprobs(token_ids, raw_logprobs, params)

    def _raw_logprobs(
        self, logits: torch.Tensor, params: list[SamplingParams]
    ) -> dict[int, torch.Tensor]:
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not rows:
            return {}
        logprobs = torch.log_softmax(logits[rows], dim=-1)
        return {row: logprobs[k] for k, row in enumerate(rows)}

    def _adjust_rows(
        self, logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: Collection[int]
    ) -> None:
        for row, seq in enumerate(seqs):
            p = seq.sampling_params
            if p.has_penalties:
                _apply_penalties(logits[row], seq, p)
            if seq.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
                if banned:
                    logits[row, banned] = float("-inf")
            if seq.guide is not None:
                seq.guide.mask_logits(logits[row])

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        chosen = logits.argmax(dim=-1)
        sampled_rows = [i for i, seq in enumerate(seqs) if not seq.sampling_params.greedy]
        if sampled_rows:
            chosen[sampled_rows] = self._sample(
                logits[sampled_rows], [seqs[i] for i in sampled_rows]
            )
        return chosen.tolist()

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [seq.sampling_params for seq in seqs]
        temperatures = torch.tensor([p.temperature for p in params], device=logits.device)
        logits = logits / temperatures.unsqueeze(1)
        if any(p.truncates for p in params):
            logits = _truncate(logits, params)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs)
        unseeded = [i for i, p in enumerate(params) if p.seed is None]
        if unseeded:
            noise[unseeded] = noise[unseeded].exponential_(generator=self._generator(logits.device))
        for i, seq in enumerate(seqs):
            if params[i].seed is not None:
                noise[i].exponential_(generator=_sequence_generator(seq, logits.device))
        return (probs / noise).argmax(dim=-1)

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._generators[device] = generator
        return generator

    @staticmethod
    def _with_logprobs(
        token_ids: list[int], raw: dict[int, torch.Tensor], params: list[SamplingParams]
    ) -> list[SampledToken]:
        out = [SampledToken(token_id) for token_id in token_ids]
        for row, logprobs in raw.items():
            sampled = out[row]
            sampled.logprob = float(logprobs[sampled.token_id])
            k = params[row].logprobs or 0
            if k:
                values, ids = torch.topk(logprobs, k)
                sampled.top = list(zip(ids.tolist(), values.tolist(), strict=True))
        return out


def _sequence_generator(seq: Sequence, device: torch.device) -> torch.Generator:
    """The sequence's own generator, seeded ``seed + index`` on first use."""
    if seq.generator is None:
        seed = seq.sampling_params.seed
        assert seed is not None
        seq.generator = torch.Generator(device=device).manual_seed(seed + seq.index)
    return seq.generator


def _apply_penalties(row: torch.Tensor, seq: Sequence, p: SamplingParams) -> None:
    """vLLM semantics: repetition over prompt and output, presence/frequency over output."""
    device = row.device
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=device)
        values = row[seen]
        row[seen] = torch.where(
            values > 0, values / p.repetition_penalty, values * p.repetition_penalty
        )
    output = seq.output_token_ids
    if output and (p.presence_penalty or p.frequency_penalty):
        ids, counts = torch.tensor(output, dtype=torch.long, device=device).unique(
            return_counts=True
        )
        row[ids] -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty


def _truncate(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Apply top-k, top-p and min-p per row with one sort over the batch."""
    device = logits.device
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    top_k = torch.tensor(
        [p.top_k if p.top_k != -1 else vocab for p in params], device=device
    ).clamp(max=vocab)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=device).unsqueeze(1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = mass_before >= top_p
    min_p = torch.tensor([p.min_p for p in params], device=device).unsqueeze(1)
    drop |= sorted_probs < min_p * sorted_probs[:, :1]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
