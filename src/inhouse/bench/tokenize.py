"""Token counts from the server's own tokenizer through its `/tokenize` endpoint (vLLM shape)."""

from __future__ import annotations

from collections import Counter

import httpx

from inhouse.bench.requests import RequestRecord

_HOW = {"tokenize": "re-tokenized with /tokenize", "chunks": "counted one per content chunk"}


class ServerTokenCounter:
    """Counts tokens with `POST /tokenize` on the server being benchmarked."""

    def __init__(self, http: httpx.AsyncClient, model: str) -> None:
        self._http = http
        self._model = model

    async def _count(self, payload: dict[str, object]) -> int:
        response = await self._http.post("/tokenize", json={"model": self._model, **payload})
        response.raise_for_status()
        body = response.json()
        return int(body["count"]) if "count" in body else len(body["tokens"])

    async def count(self, text: str) -> int:
        """Tokens in `text` as a raw completion prompt (no special tokens added)."""
        return await self._count({"prompt": text, "add_special_tokens": False})

    async def chat_overhead(self) -> int:
        """Tokens the chat template adds around one user message; 0 when the server can't say."""
        try:
            empty = await self._count(
                {"messages": [{"role": "user", "content": ""}], "add_generation_prompt": True}
            )
        except (httpx.HTTPError, ValueError, KeyError):
            return 0
        return empty


async def probe_token_counter(http: httpx.AsyncClient, model: str) -> ServerTokenCounter | None:
    """A counter when the server answers `/tokenize`, otherwise None."""
    counter = ServerTokenCounter(http, model)
    try:
        counted = await counter.count("hello")
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    # llama.cpp's /tokenize reads `content`, so our `prompt` comes back as no tokens
    return counter if counted > 0 else None


async def fill_missing_token_counts(
    records: list[RequestRecord], counter: ServerTokenCounter | None
) -> str | None:
    """Count output tokens of successful requests whose stream carried no `usage`.

    Uses the server's `/tokenize` on the streamed text, or, without it, one token per content
    chunk. Returns a sentence saying what was done, or None when every request had usage.
    """
    missing = [r for r in records if r.ok and r.token_source is None]
    if not missing:
        return None
    for record in missing:
        record.output_tokens, record.token_source = len(record.chunk_times), "chunks"
        if counter is not None:
            try:
                record.output_tokens = await counter.count(record.output_text)
                record.token_source = "tokenize"
            except (httpx.HTTPError, ValueError, KeyError):
                pass
    ways = Counter(record.token_source for record in missing)
    how = ", ".join(f"{n} {_HOW[way]}" for way, n in sorted(ways.items()))
    return f"{len(missing)} responses carried no usage; output tokens: {how}"
