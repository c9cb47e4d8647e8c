"""The calibration's acceptance probe: how many draft tokens the server's speculative decoding
accepts on a workload, read from its vLLM-named counters before and after.

A server whose `/version` has no ``speculative_config`` (or whose `/metrics` lacks the
``spec_decode`` families) does not speculate: no probe, no speculation in the profile.
The probe sends its requests one at a time (greedy, EOS ends them), so the batch-size gate
never turns drafting off. Acceptance is workload-specific: the built-in prompts ask to copy,
edit or summarise a passage given in the prompt, where prompt lookup pays; give the team's
own traffic (bench's JSONL dataset) for a figure that fits it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import httpx

from inhouse.bench.datasets import random_words
from inhouse.bench.loadgen import LoadShape, Sender, generate_load
from inhouse.bench.requests import BenchRequest
from inhouse.bench.scrape import ServerReading, read_gauges
from inhouse.plan.errors import PlanError
from inhouse.plan.speculation import Speculation, measured_speculation

TASKS = (
    "Copy the following passage exactly, word for word:",
    "Rewrite the following passage with each sentence on its own line:",
    "Summarise the following passage, quoting its key phrases:",
    "Repeat the following passage, then list its first ten words:",
)


def passage(rng: random.Random, words: int) -> str:
    """Sentences of 8 to 14 random words, `words` in all, from the seed of `rng`."""
    sentences, left = [], words
    while left > 0:
        size = min(left, rng.randint(8, 14))
        sentence = random_words(rng, size)
        sentences.append(" ".join(sentence).capitalize() + ".")
        left -= size
    return " ".join(sentences)


def copy_edit_prompts(
    count: int, *, words: int = 120, max_tokens: int = 96, seed: int = 28
) -> list[BenchRequest]:
    """The built-in probe: chat requests that copy, edit or summarise a seeded passage."""
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        content = f"{TASKS[index % len(TASKS)]}\n\n{passage(rng, words)}"
        messages = ({"role": "user", "content": content},)
        requests.append(BenchRequest(index=index, max_tokens=max_tokens, messages=messages))
    return requests


def _speculative_config(version: Any) -> dict[str, Any] | None:
    config = version.get("speculative_config") if isinstance(version, dict) else None
    return config if isinstance(config, dict) else None


async def _reading(http: httpx.AsyncClient) -> ServerReading | None:
    response = await http.get("/metrics", timeout=10.0)
    if response.status_code != 200:
        return None
    try:
        return read_gauges(response.text)
    except ValueError:
        return None


def _spec_counters(reading: ServerReading | None) -> tuple[float, float, float] | None:
    if reading is None:
        return None
    drafts, tokens, accepted = (
        reading.spec_drafts, reading.spec_draft_tokens, reading.spec_accepted_tokens
    )  # fmt: skip
    if drafts is None or tokens is None or accepted is None:
        return None
    return drafts, tokens, accepted


async def probe_acceptance(
    http: httpx.AsyncClient, send: Sender, requests: Sequence[BenchRequest]
) -> Speculation | None:
    """Send `requests` one at a time with `send`; the acceptance the counters grew by, or
    None when the server does not speculate. PlanError when its config or counters are
    unreadable or a request fails."""
    version = await http.get("/version", timeout=10.0)
    config = _speculative_config(version.json() if version.status_code == 200 else None)
    before = _spec_counters(await _reading(http))
    if config is None or before is None:
        return None
    shape = LoadShape(max_concurrency=1, num_prompts=len(requests))
    records = (await generate_load(list(requests), send, shape)).records
    failed = [r for r in records if not r.ok]
    if failed:
        reason = failed[0].error or failed[0].status
        raise PlanError(f"an acceptance probe request failed: {reason}")
    after = _spec_counters(await _reading(http))
    if after is None:
        raise PlanError("the speculative-decoding counters left /metrics during the probe")
    drafts, draft_tokens, accepted = (a - b for a, b in zip(after, before, strict=True))
    k, gate = config.get("num_speculative_tokens"), config.get("disable_by_batch_size")
    if not isinstance(k, int) or not (gate is None or isinstance(gate, int)):
        raise PlanError(f"the server's speculative_config is unreadable: {config}")
    return measured_speculation(k, gate, drafts, draft_tokens, accepted, len(records))
