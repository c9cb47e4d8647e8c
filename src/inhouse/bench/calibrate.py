"""`inhouse bench calibrate`: short controlled probes that fit the plan's step-time model.

Prefill probes send prompts of growing length one at a time and time their first token; decode
probes send 1, 2, 4, … requests together with short prompts and a fixed number of output tokens
(``ignore_eos``) and take the median gap between tokens while all of them stream, at a short
and a long context (four 1,024-token contexts show a decode's attention above a noisy host's
jitter; prefills that take more than one step delay a few gaps, which the median leaves out).
Long probes send one prompt of 2,048 and one of 4,096 tokens (chunked past the step budget):
their first token fixes the prefill's attention-pair cost where it matters, which short prompts
hardly see, and their gaps are one sequence decoding over that context. Every prompt is fresh
random words, drawn from a seed new to each calibration, so nothing but the chat template's
first block is found in a prefix cache, not even after an earlier calibration of the same
server (whose cached prompts made a 2,023-token prefill of vLLM's look 17× faster than it is).
The fit (`inhouse.plan.fit`) turns the points into a `StepCost`; the profile file holds it, the
points and the scheduler settings the simulator should assume. A server that speculates gets an
acceptance probe too (`inhouse.bench.acceptance`). Works against any OpenAI-compatible server.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from inhouse.bench.acceptance import copy_edit_prompts, probe_acceptance
from inhouse.bench.client import StreamingClient, auth_headers, normalize_base_url
from inhouse.bench.datasets import LengthSpec, random_dataset
from inhouse.bench.loadgen import LoadShape, generate_load
from inhouse.bench.preflight import check_endpoint
from inhouse.bench.requests import BenchRequest, RequestRecord
from inhouse.bench.tokenize import ServerTokenCounter, probe_token_counter
from inhouse.plan.fit import DecodePoint, PrefillPoint, fit_step_cost
from inhouse.plan.perf_model import Profile
from inhouse.plan.speculation import Speculation


@dataclass(frozen=True, slots=True)
class Probes:
    """Which probes to run; prompts longer than the step budget are left out."""

    prefill_prompts: tuple[int, ...] = (64, 256, 512, 1024)
    prefill_repeats: int = 3  # an odd count: the median drops one hiccup; of 2 it is a mean
    long_prompts: tuple[int, ...] = (2048, 4096)  # once each, up to the model's length
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_prompt: int = 64
    decode_output: int = 24
    long_prompt: int = 1024
    long_batches: tuple[int, ...] = (4,)
    acceptance_requests: int = 8
    acceptance_output: int = 96


@dataclass(frozen=True, slots=True)
class Target:
    """The server to calibrate and the scheduler settings it runs with."""

    base_url: str
    model: str
    api_key: str | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    timeout: float = 120.0
    acceptance_prompts: tuple[BenchRequest, ...] | None = None  # None: the built-in set
    acceptance_base_url: str | None = None  # None: probe acceptance on `base_url` itself


class CalibrationError(RuntimeError):
    """A probe failed, so no profile can be fitted."""


def _checked(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    failed = [r for r in records if not r.ok]
    if failed:
        raise CalibrationError(f"a probe request failed: {failed[0].error or failed[0].status}")
    return list(records)


async def _max_model_len(http: httpx.AsyncClient, model: str) -> int:
    """The model's `max_model_len` as vLLM and `inhouse serve` list it; unlimited if absent."""
    listed = (await http.get("/v1/models")).json().get("data") or []
    card = next((m for m in listed if isinstance(m, dict) and m.get("id") == model), {})
    value = card.get("max_model_len")
    return value if isinstance(value, int) and value > 0 else 1 << 30


class _Prober:
    def __init__(self, client: StreamingClient, counter: ServerTokenCounter | None) -> None:
        self.client = client
        self.counter = counter
        self.overhead = 0
        self.seed = random.SystemRandom().randrange(1 << 48)  # new prompts every calibration

    async def prompts(self, count: int, prompt: int, output: int) -> list[BenchRequest]:
        self.seed += 1
        return await random_dataset(
            count,
            LengthSpec(prompt),
            LengthSpec(output),
            seed=self.seed,
            counter=self.counter,
            template_overhead=self.overhead,
        )

    async def together(self, requests: Sequence[BenchRequest]) -> list[RequestRecord]:
        shape = LoadShape(max_concurrency=len(requests), num_prompts=len(requests))
        return _checked((await generate_load(requests, self.client.send, shape)).records)

    async def prefill(self, prompt: int, repeats: int) -> PrefillPoint:
        records = []
        for request in await self.prompts(repeats, prompt, 1):
            records.extend(await self.together([request]))
        tokens = statistics.median(r.prompt_tokens or prompt for r in records)
        return PrefillPoint(round(tokens), statistics.median(r.ttft or 0.0 for r in records))

    async def decode(self, batch: int, prompt: int, output: int) -> DecodePoint:
        records = await self.together(await self.prompts(batch, prompt, output))
        return _decode_point(records, prompt, output)

    async def long(self, prompt: int, output: int) -> tuple[PrefillPoint, DecodePoint]:
        """One long prompt alone: its first token as a prefill point, its gaps as a decode."""
        (record,) = await self.together(await self.prompts(1, prompt, output))
        first_token = PrefillPoint(record.prompt_tokens or prompt, record.ttft or 0.0)
        return first_token, _decode_point([record], prompt, output)


def _together_gaps(records: list[RequestRecord]) -> list[float]:
    """The gaps between chunks while every request streams: from the last first token to the
    first last one. Requests sent together can start a step or two apart (a new connection, a
    prefill on its own), and a batch of two that decodes one alone for a while is not a batch
    of two. All gaps if the requests never stream at once."""
    times = [r.chunk_times for r in records if r.chunk_times]
    start = max(t[0] for t in times)
    end = min(t[-1] for t in times)
    inside = [
        later - earlier
        for t in times
        for earlier, later in itertools.pairwise(t)
        if earlier >= start and later <= end
    ]
    return inside or [gap for r in records for gap in r.itl]


def _decode_point(records: list[RequestRecord], prompt: int, output: int) -> DecodePoint:
    """The requests decoding together: their median gap, at their mean context mid-output."""
    if not any(r.itl for r in records):
        raise CalibrationError("a decode probe streamed no token gaps (is streaming on?)")
    gaps = _together_gaps(records)
    context = statistics.mean((r.prompt_tokens or prompt) for r in records) + output // 2
    return DecodePoint(len(records), round(context), statistics.median(gaps))


async def _run_probes(
    prober: _Prober, target: Target, probes: Probes, longest: int
) -> tuple[list[PrefillPoint], list[DecodePoint]]:
    """The prefill, decode and long probes, within the server's step budget, sequence limit
    and model length (`longest`)."""
    cap = min(target.max_num_batched_tokens, longest - 2)
    short = sorted({min(p, cap) for p in probes.prefill_prompts})
    prefill = [await prober.prefill(p, probes.prefill_repeats) for p in short]
    decode = [
        await prober.decode(b, probes.decode_prompt, probes.decode_output)
        for b in probes.decode_batches
        if b <= target.max_num_seqs
    ]
    longest_prompt = longest - probes.decode_output - 1
    for p in sorted({min(p, longest_prompt) for p in probes.long_prompts}):
        if p > short[-1]:
            first_token, gaps = await prober.long(p, probes.decode_output)
            prefill.append(first_token)
            decode.append(gaps)
    long_prompt = min(probes.long_prompt, longest_prompt)
    decode += [
        await prober.decode(b, long_prompt, probes.decode_output)
        for b in probes.long_batches
        if b <= target.max_num_seqs
    ]
    return prefill, decode


async def calibrate(target: Target, probes: Probes = Probes()) -> Profile:
    """Run the probes against the server and fit its profile."""
    started = time.monotonic()
    async with httpx.AsyncClient(
        base_url=normalize_base_url(target.base_url),
        headers=auth_headers(target.api_key),
        timeout=httpx.Timeout(30.0, connect=5.0),
    ) as http:
        await check_endpoint(http, target.model)
        longest = await _max_model_len(http, target.model)
        counter = await probe_token_counter(http, target.model)
        async with StreamingClient(
            target.base_url,
            target.model,
            api_key=target.api_key,
            timeout=target.timeout,
            sampling={"temperature": 0.0, "ignore_eos": True},
        ) as client:
            prober = _Prober(client, counter)
            if counter is not None:
                prober.overhead = await counter.chat_overhead()
            await prober.together(await prober.prompts(2, probes.decode_prompt, 4))  # warm-up
            prefill, decode = await _run_probes(prober, target, probes, longest)
    speculation = await _acceptance(target, probes)
    cost = fit_step_cost(prefill, decode, source=f"calibrated: {target.base_url}")
    return Profile(
        cost=cost,
        model=target.model,
        max_num_seqs=target.max_num_seqs,
        max_num_batched_tokens=target.max_num_batched_tokens,
        measured={
            "prefill": [{"prompt_tokens": p.prompt, "ttft_s": p.ttft} for p in prefill],
            "decode": [
                {"batch": d.batch, "context_tokens": d.context, "step_s": d.step} for d in decode
            ],
            "seconds": round(time.monotonic() - started, 1),
            "acceptance_base_url": target.acceptance_base_url,
        },
        speculation=speculation,
    )


async def _acceptance(target: Target, probes: Probes) -> Speculation | None:
    """The acceptance probe, greedy with EOS left on, as the team's requests would run, on
    the acceptance server (the calibrated one unless another is named)."""
    url = target.acceptance_base_url or target.base_url
    prompts = target.acceptance_prompts or tuple(
        copy_edit_prompts(probes.acceptance_requests, max_tokens=probes.acceptance_output)
    )
    async with (
        httpx.AsyncClient(
            base_url=normalize_base_url(url), headers=auth_headers(target.api_key),
            timeout=httpx.Timeout(30.0, connect=5.0),
        ) as http,
        StreamingClient(
            url, target.model, api_key=target.api_key, timeout=target.timeout,
            sampling={"temperature": 0.0},
        ) as client,
    ):  # fmt: skip
        speculation = await probe_acceptance(http, client.send, prompts)
    if speculation is None and target.acceptance_base_url is not None:
        raise CalibrationError(
            f"{url} does not speculate (no speculative_config in /version, or no "
            "spec_decode counters in /metrics): start it with --speculative-config"
        )
    return speculation


def describe(profile: Profile) -> list[str]:
    """The probes and the fitted coefficients, one line each, for the console."""
    cost, measured = profile.cost, profile.measured
    lines = [
        f"prefill {p['prompt_tokens']:>5} tokens alone: TTFT {p['ttft_s'] * 1000:7.1f} ms"
        for p in measured["prefill"]
    ]
    lines += [
        f"decode batch {d['batch']:>3} at {d['context_tokens']:>5} tokens: "
        f"{d['step_s'] * 1000:6.1f} ms a token"
        for d in measured["decode"]
    ]
    lines.append(
        f"step = {cost.base_s * 1000:.2f} ms + max({cost.weights_s * 1000:.2f} ms, "
        f"{cost.token_s * 1e6:.1f} µs × tokens) + {cost.seq_s * 1e6:.0f} µs × decodes + "
        f"{cost.context_s * 1e9:.1f} ns × context + {cost.pair_s * 1e9:.3f} ns × prefill pairs; "
        f"TTFT adds {cost.request_s * 1000:.1f} ms"
    )
    if profile.speculation is not None:
        lines.append(profile.speculation.describe())
        if profile.measured.get("acceptance_base_url") is None:
            lines.append(
                "note: the decode probes ran with speculation on; for the step cost without "
                "it, calibrate the server without --speculative-config and name this one "
                "with --acceptance-base-url"
            )
    lines.append(f"calibrated in {measured['seconds']} s")
    return lines
