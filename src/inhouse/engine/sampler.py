"""The batched sampler: one logits row per sequence in, one token per sequence out.

Work is batched across rows; only rows that need it pay for per-row steps
(guides, penalties, min_tokens bans, seeded generators). A row that raises (a guide
that fails, a seed that overflows) comes back as its exception; the others still
get their tokens. Greedy rows take one
argmax. Sampling draws by the exponential race ``argmax(p / q)``, ``q ~ Exp(1)``,
which lets each seeded row draw its noise from its own ``torch.Generator`` so its
tokens do not depend on its neighbours in the batch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.sequence import Sequence

# Truncating rows sample among their top tokens when the cut falls inside them.
CANDIDATES = 256


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
    ) -> list[SampledToken | Exception]:
        """One token per row, or the exception that row raised (a guide, a penalty, a seed);
        a failing row never costs the others their token."""
        params = [seq.sampling_params for seq in seqs]
        raw_logprobs = self._raw_logprobs(logits, params)
        failed = self._adjust_rows(logits, seqs, eos_token_ids)
        ok = [row for row in range(len(seqs)) if row not in failed]
        picked: dict[int, int | Exception] = {}
        if ok:
            rows = logits[ok] if failed else logits
            picked = dict(zip(ok, self._choose_each(rows, [seqs[i] for i in ok]), strict=True))
        out: list[SampledToken | Exception] = []
        for row, p in enumerate(params):
            result = failed[row] if row in failed else picked[row]
            if not isinstance(result, Exception):
                result = _sampled(result, raw_logprobs.get(row), p.logprobs or 0)
            out.append(result)
        return out

    def _choose_each(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int | Exception]:
        """The batched choice; if it raises, each row alone, so only the culprit fails."""
        try:
            return list(self._choose(logits, seqs))
        except Exception as error:
            if len(seqs) == 1:
                return [error]
        return [self._choose_each(logits[r : r + 1], [seq])[0] for r, seq in enumerate(seqs)]

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
    ) -> dict[int, Exception]:
        """Penalties, min_tokens bans and grammar masks, in place; returns the rows that raised."""
        failed: dict[int, Exception] = {}
        for row, seq in enumerate(seqs):
            p = seq.sampling_params
            try:
                if p.has_penalties:
                    _apply_penalties(logits[row], seq, p)
                if seq.num_output_tokens < p.min_tokens:
                    banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
                    if banned:
                        logits[row, banned] = float("-inf")
                if seq.guide is not None:
                    seq.guide.mask_logits(logits[row])
            except Exception as error:
                failed[row] = error
        return failed

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        chosen = argmax_rows(logits)
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
        chosen = torch.empty(len(seqs), dtype=torch.long, device=logits.device)
        full = list(range(len(seqs)))
        truncating = [i for i in full if params[i].truncates]
        if truncating and logits.shape[-1] > CANDIDATES:
            exact, tokens = self._sample_candidates(
                logits[truncating], [seqs[i] for i in truncating]
            )
            done = [row for row, ok in zip(truncating, exact, strict=True) if ok]
            chosen[done] = tokens[exact]
            full = sorted(set(full) - set(done))
        if full:
            rows = logits[full]
            row_params = [params[i] for i in full]
            if any(p.truncates for p in row_params):
                sorted_logits, order = rows.sort(dim=-1, descending=True)
                kept = _truncate_sorted(sorted_logits, row_params, None)
                rows = torch.empty_like(rows).scatter_(-1, order, kept)
            chosen[full] = self._race(torch.softmax(rows, dim=-1), [seqs[i] for i in full])
        return chosen

    def _sample_candidates(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample among each row's top ``CANDIDATES`` tokens; exact for rows whose top-k,
        top-p or min-p cut already falls inside them (the returned mask says which)."""
        params = [seq.sampling_params for seq in seqs]
        values, index = logits.topk(CANDIDATES, dim=-1)
        kept = _truncate_sorted(values, params, logits.logsumexp(dim=-1, keepdim=True))
        small_k = torch.tensor(
            [p.top_k != -1 and p.top_k <= CANDIDATES for p in params], device=logits.device
        )
        exact = small_k | kept[:, -1].isinf()
        picked = self._race(torch.softmax(kept, dim=-1), seqs)
        return exact, index.gather(-1, picked.unsqueeze(1)).squeeze(1)

    def _race(self, probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One draw per row: ``argmax(p / q)`` with ``q ~ Exp(1)`` from the row's generator."""
        noise = torch.empty_like(probs)
        unseeded = [i for i, seq in enumerate(seqs) if seq.sampling_params.seed is None]
        if unseeded:
            noise[unseeded] = noise[unseeded].exponential_(generator=self._generator(probs.device))
        for i, seq in enumerate(seqs):
            if seq.sampling_params.seed is not None:
                noise[i].exponential_(generator=_sequence_generator(seq, probs.device))
        return argmax_rows(probs / noise)

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


def argmax_rows(values: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest value, the first of ties (NaN counting as largest), as
    ``torch.argmax``: by numpy on CPU float32 rows (~5 us a 49,152-wide row against torch's
    ~67 us, paid for every token a step samples or verifies), by torch elsewhere."""
    if values.device.type == "cpu" and values.dtype == torch.float32:
        return torch.from_numpy(values.numpy().argmax(axis=-1))
    return values.argmax(dim=-1)


def _sampled(token_id: int, logprobs: torch.Tensor | None, top: int) -> SampledToken:
    """The token with its raw logprob and ``top`` alternatives when they were asked for."""
    sampled = SampledToken(token_id)
    if logprobs is not None:
        sampled.logprob = float(logprobs[token_id])
        if top:
            values, ids = torch.topk(logprobs, top)
            sampled.top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return sampled


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


def _truncate_sorted(
    sorted_logits: torch.Tensor, params: list[SamplingParams], full_lse: torch.Tensor | None
) -> torch.Tensor:
    """Mask top-k, top-p and min-p on logits sorted in descending order (per row).

    The block is either the whole vocabulary (``full_lse`` None) or each row's top
    candidates, whose probabilities are normalized over the whole vocabulary via
    ``full_lse`` unless top-k already cut inside the block.
    """
    device = sorted_logits.device
    width = sorted_logits.shape[-1]
    top_k = torch.tensor([p.top_k if p.top_k != -1 else width + 1 for p in params], device=device)
    ranks = torch.arange(width, device=device).unsqueeze(0)
    masked = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    log_norm = masked.logsumexp(dim=-1, keepdim=True)
    if full_lse is not None:
        log_norm = torch.where(top_k.unsqueeze(1) <= width, log_norm, full_lse)
    probs = (masked - log_norm).exp()
    top_p = torch.tensor([p.top_p for p in params], device=device).unsqueeze(1)
    drop = probs.cumsum(dim=-1) - probs >= top_p
    min_p = torch.tensor([p.min_p for p in params], device=device).unsqueeze(1)
    drop |= probs < min_p * probs[:, :1]
    drop[:, 0] = False
    return masked.masked_fill(drop, float("-inf"))
