"""What one benchmark request asks for and what the client observed while it ran."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Endpoint = Literal["chat", "completions"]
TokenSource = Literal["usage", "tokenize", "chunks"]

ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
}


@dataclass(slots=True, frozen=True)
class BenchRequest:
    """One prompt to send: chat messages or a completion prompt, and how many tokens to ask for."""

    index: int
    max_tokens: int
    messages: tuple[dict[str, Any], ...] | None = None  # a content: text, or parts
    prompt: str | None = None
    intended_input_tokens: int | None = None

    @property
    def endpoint(self) -> Endpoint:
        """`chat` when the request carries messages, `completions` when it carries a prompt."""
        return "chat" if self.messages is not None else "completions"


@dataclass(slots=True)
class RequestRecord:
    """Everything the client saw for one request.

    `start` is seconds since the run began; `ttft`, `e2e` and `chunk_times` are seconds since
    this request was sent. A failed request's `e2e` lasts until it failed.
    """

    index: int
    start: float
    status: int | None = None
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    token_source: TokenSource | None = None
    intended_input_tokens: int | None = None
    finish_reason: str | None = None
    output_text: str = ""

    @property
    def ok(self) -> bool:
        """A request succeeded when it got HTTP 200 and the stream ended cleanly."""
        return self.status == 200 and self.error is None

    @property
    def outcome(self) -> str:
        """`ok`, `http_<status>` or the client-side error kind (`timeout`, `connection`, …)."""
        if self.ok:
            return "ok"
        if self.status is not None and self.status != 200:
            return f"http_{self.status}"
        return (self.error or "error").split(":", 1)[0]

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive content chunks of this request, in seconds."""
        times = self.chunk_times
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    @property
    def tpot(self) -> float | None:
        """(E2E − TTFT) / (output_tokens − 1): time per output token after the first, as vLLM."""
        if not self.ok or self.ttft is None or self.e2e is None:
            return None
        if self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """The record as stored in the results file (see `inhouse.bench.schema`)."""
        data = asdict(self)
        data["ok"] = self.ok
        data["outcome"] = self.outcome
        data["tpot"] = self.tpot
        return data
