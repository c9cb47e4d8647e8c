"""Each poison request of issue 9 (values that overflow int64 or a torch seed, lone
surrogates, degenerate inputs, bad stream_options, deep nesting) gets a 4xx in OpenAI's
shape while eight normal streams run, straight to `inhouse serve` and through the
gateway; every stream completes and the server stays healthy."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

if TYPE_CHECKING:  # the fixture's types; conftest is not a module to import at run time
    from conftest import Edges, Target

pytestmark = pytest.mark.slow

STREAMS = 8
STREAM_TOKENS = 24
HI = [{"role": "user", "content": "Count from one to twenty."}]
SURROGATE = "\udfff"


def _poisons(target: Target) -> list[tuple[str, str, bytes]]:
    """(name, path, raw body) of each poison; bodies are encoded by hand so that lone
    surrogates and absurd numbers reach the server exactly as an attacker sends them."""
    chat, emb = target.chat_model, target.embedding_model

    def chat_body(**fields: Any) -> bytes:
        return json.dumps({"model": chat, "messages": HI, **fields}).encode()

    deep = b'{"model": "%s", "messages": ' % chat.encode() + b"[" * 5000 + b"]" * 5000 + b"}"
    return [
        ("top_k 2**63", "/v1/chat/completions", chat_body(top_k=2**63)),
        ("seed 2**64", "/v1/chat/completions", chat_body(seed=2**64)),
        ("seed -2**63-1", "/v1/chat/completions", chat_body(seed=-(2**63) - 1)),
        ("max_tokens 2**63", "/v1/chat/completions", chat_body(max_tokens=2**63)),
        ("max_completion_tokens 0", "/v1/chat/completions", chat_body(max_completion_tokens=0)),
        ("n 2**63", "/v1/chat/completions", chat_body(n=2**63)),
        (  # past the vocabulary: indexed the logits when banned by min_tokens
            "stop_token_ids 2**31-1",
            "/v1/chat/completions",
            chat_body(stop_token_ids=[2**31 - 1], min_tokens=2, max_tokens=4),
        ),
        ("logit_bias key 2**40", "/v1/chat/completions", chat_body(logit_bias={str(2**40): 1})),
        (
            "temperature 1e999",
            "/v1/chat/completions",
            chat_body(temperature=7).replace(b'"temperature": 7', b'"temperature": 1e999'),
        ),
        (
            "surrogate in chat",
            "/v1/chat/completions",
            chat_body(messages=[{"role": "user", "content": SURROGATE}]),
        ),
        (
            "surrogate in completions",
            "/v1/completions",
            json.dumps({"model": chat, "prompt": "a" + SURROGATE}).encode(),
        ),
        (
            "token id 2**40",
            "/v1/completions",
            json.dumps({"model": chat, "prompt": [2**40]}).encode(),
        ),
        (
            "surrogate in tokenize",
            "/tokenize",
            json.dumps({"model": chat, "prompt": SURROGATE}).encode(),
        ),
        ("embeddings [[]]", "/v1/embeddings", json.dumps({"model": emb, "input": [[]]}).encode()),
        ("embeddings ['']", "/v1/embeddings", json.dumps({"model": emb, "input": [""]}).encode()),
        (
            "surrogate in embeddings",
            "/v1/embeddings",
            json.dumps({"model": emb, "input": SURROGATE}).encode(),
        ),
        *(
            (
                f"stream_options {bad!r}",
                "/v1/chat/completions",
                chat_body(stream=True, stream_options=bad),
            )
            for bad in ("yes", [1], 5)
        ),
        ("JSON 5,000 deep", "/v1/chat/completions", deep),
    ]


async def _stream(client: openai.AsyncOpenAI, model: str, started: asyncio.Event) -> str:
    """One normal greedy stream to its end; its finish reason."""
    stream = await client.chat.completions.create(
        model=model,
        messages=HI,
        max_tokens=STREAM_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    reason = ""
    async for chunk in stream:
        started.set()
        for choice in chunk.choices:
            reason = choice.finish_reason or reason
    return reason


async def _run(target: Target) -> tuple[list[str], list[tuple[str, int, Any]]]:
    client = openai.AsyncOpenAI(base_url=f"{target.url}/v1", api_key=target.key, max_retries=0)
    started = [asyncio.Event() for _ in range(STREAMS)]
    streams = [asyncio.create_task(_stream(client, target.chat_model, e)) for e in started]
    answers = []
    async with httpx.AsyncClient(base_url=target.url, headers=target.headers, timeout=60) as http:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
        for name, path, raw in _poisons(target):
            headers = {"content-type": "application/json"}
            response = await http.post(path, content=raw, headers=headers)
            answers.append((name, response.status_code, response.json()))
    reasons = await asyncio.wait_for(asyncio.gather(*streams), 300)
    await client.close()
    return reasons, answers


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_poison_requests_get_4xx_while_eight_streams_complete(edges: Edges, via: str) -> None:
    target = getattr(edges, via)
    reasons, answers = asyncio.run(_run(target))
    assert reasons == ["length"] * STREAMS
    for name, status, body in answers:
        assert 400 <= status < 500, (name, status, body)
        assert set(body) == {"error"}, (name, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}, (name, body)
    assert httpx.get(f"{target.url}/health", timeout=10).status_code == 200
