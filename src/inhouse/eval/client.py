"""Ask one endpoint one item over HTTP: deterministic settings, retries on 429/503 and on a
dropped connection (honouring ``Retry-After``), every other failure counted, never raised."""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from inhouse.api.auth import auth_headers
from inhouse.api.errors import error_message
from inhouse.bench.client import normalize_base_url
from inhouse.eval.graders import Answer, grade
from inhouse.eval.items import EvalItem

RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible server and the model to ask there."""

    name: str
    url: str
    model: str
    api_key: str | None = None

    @property
    def root(self) -> str:
        return normalize_base_url(self.url)


@dataclass(frozen=True, slots=True)
class Settings:
    """How every item is asked: deterministic by default."""

    temperature: float = 0.0
    seed: int | None = 0
    timeout_s: float = 120.0
    retries: int = 5  # extra attempts after a 429, a 503 or a dropped connection
    max_retry_wait_s: float = 60.0
    backoff_s: float = 0.5  # first wait when the server gives no Retry-After

    def key(self) -> dict[str, Any]:
        """What must match for a stored answer to be reused on resume."""
        return {"temperature": self.temperature, "seed": self.seed}


@dataclass(slots=True)
class ItemResult:
    """One item's outcome on one endpoint."""

    id: str
    correct: bool
    text: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None  # the last failure, when no answer came back
    status: int | None = None
    attempts: int = 0
    latency_s: float | None = None  # of the answered attempt
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def request_body(item: EvalItem, model: str, settings: Settings) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the item's request."""
    body: dict[str, Any] = {
        "model": model,
        "temperature": settings.temperature,
        "max_tokens": item.max_tokens,
    }
    if settings.seed is not None:
        body["seed"] = settings.seed
    if item.prompt is not None:
        return "/v1/completions", body | {"prompt": item.prompt}
    body["messages"] = item.messages
    for name in ("tools", "tool_choice", "response_format"):
        if getattr(item, name) is not None:
            body[name] = getattr(item, name)
    return "/v1/chat/completions", body


def retry_after(headers: httpx.Headers, fallback: float, cap: float) -> float:
    """Seconds to wait: ``Retry-After`` as seconds or an HTTP date, else ``fallback``."""
    value = headers.get("retry-after")
    if value is None:
        return min(fallback, cap)
    try:
        wait = float(value)
    except ValueError:
        try:
            wait = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            wait = fallback
    return min(max(wait, 0.0), cap)


def _answer(path: str, payload: dict[str, Any]) -> Answer:
    choice = payload["choices"][0]
    if path == "/v1/completions":
        return Answer(choice.get("text") or "")
    message = choice.get("message") or {}
    calls = tuple(
        (c["function"]["name"], c["function"].get("arguments") or "")
        for c in message.get("tool_calls") or []
    )
    return Answer(message.get("content") or "", calls)


async def ask(
    http: httpx.AsyncClient, endpoint: Endpoint, item: EvalItem, settings: Settings
) -> ItemResult:
    """Send the item (retrying what is worth retrying) and grade the answer."""
    path, body = request_body(item, endpoint.model, settings)
    result = ItemResult(item.id, correct=False)
    wait = settings.backoff_s
    for attempt in range(1, settings.retries + 2):
        result.attempts = attempt
        started = time.perf_counter()
        try:
            response = await http.post(
                endpoint.root + path,
                json=body,
                headers=auth_headers(endpoint.api_key),
                timeout=settings.timeout_s,
            )
        except httpx.TransportError as err:
            result.status, result.error = None, f"{type(err).__name__}: {err}"
            delay = min(wait, settings.max_retry_wait_s)
        else:
            result.status = response.status_code
            if response.status_code == 200:
                return _graded(result, item, path, response, time.perf_counter() - started)
            result.error = f"HTTP {response.status_code}: {error_message(response.content)}"
            if response.status_code not in RETRY_STATUSES:
                return result
            delay = retry_after(response.headers, wait, settings.max_retry_wait_s)
        if attempt <= settings.retries:
            await asyncio.sleep(delay)
            wait *= 2
    return result


def _graded(
    result: ItemResult, item: EvalItem, path: str, response: httpx.Response, latency: float
) -> ItemResult:
    try:
        payload = response.json()
        answer = _answer(path, payload)
    except (ValueError, KeyError, IndexError, TypeError):
        result.error = "HTTP 200 but not an OpenAI-shaped completion"
        return result
    usage = payload.get("usage") or {}
    result.error = None
    result.text, result.tool_calls = answer.text, list(answer.tool_calls)
    result.latency_s = latency
    result.prompt_tokens = usage.get("prompt_tokens")
    result.completion_tokens = usage.get("completion_tokens")
    result.correct = grade(item, answer)
    return result
