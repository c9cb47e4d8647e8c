"""A request the gateway admitted, and what came back for it from upstream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from inhouse.gateway.config import ModelRoute
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.needs import Needs
from inhouse.gateway.priority import DEFAULT_CLASS
from inhouse.gateway.releases.answer_checks import AnswerChecks, Expectations
from inhouse.gateway.releases.canary import ReleasePick
from inhouse.gateway.routing import Lease


@dataclass(slots=True)
class Outcome:
    """What came back from upstream, filled in as it passes (by `upstream` alone)."""

    status: int = 0
    completed: bool = False  # False while a stream is still passing (or was cut off)
    error_type: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # an answer cut off before its usage: the prompt counted by /tokenize, else its bound
    prompt_counted: int | None = None
    content_chunks: int = 0  # chunks that carried generated text or a tool call
    finish_reason: str | None = None
    first_token_at: float | None = None
    text: list[str] | None = None  # kept for keys that log content, and to compare shadows
    # collected with the text: the first choice's tool calls, index -> (name, arguments)
    tool_calls: dict[int, tuple[str, str]] = field(default_factory=dict)

    def calls(self) -> list[tuple[str, str]]:
        """The tool calls collected, in order: (name, arguments JSON text)."""
        return [self.tool_calls[i] for i in sorted(self.tool_calls)]


class PrimaryWaiter(Protocol):
    """What waits for how a call ended: its shadow copy (`shadow.ShadowTicket`), which the
    call's settlement hands its end to."""

    def primary_settled(
        self, status: int, outcome: Outcome, latency_s: float, ttft_s: float | None,
        checks: AnswerChecks,
    ) -> None: ...  # fmt: skip


@dataclass(slots=True)
class Call:
    """A request that passed admission, carried to its settlement."""

    key: ApiKey
    route: ModelRoute
    endpoint: str
    needs: Needs
    prompt: int
    output_cap: int
    reserve: int
    stream: bool
    ts: float
    started: float
    headers: dict[str, str]
    prompt_text: str | None
    lease: Lease | None = None
    settled: bool = False
    client_left: bool = False
    metered: bool = True  # False: runs no model, charges no tokens (/tokenize, /detokenize)
    release: ReleasePick | None = None  # None while the model has no releases
    shadow: PrimaryWaiter | None = None  # the mirrored copy waiting for this call's outcome
    hold: str | None = None  # what it holds of its key's quota and its team's (`holds`)
    prompt_hash: str | None = None  # peppered hash of the prompt: tells a retry (audit)
    expects: Expectations | None = None  # set when the answer is checked (answer_checks)
    priority: str = DEFAULT_CLASS  # the class it runs at, after the clamp (`priority`)
    degraded_from: str | None = None  # the model asked for, when a smaller one answers
    adapter: str | None = None  # the LoRA adapter asked for, on `route` (`adapters`)

    @property
    def release_name(self) -> str:
        """The name its releases are kept under: the adapter asked for, else the model."""
        return self.adapter or self.route.name

    @property
    def keeps_text(self) -> bool:
        """Whether the answer's text and tool calls are collected (for the checks and the
        shadow comparison; the text is stored only for `log_content`)."""
        return self.key.log_content or self.shadow is not None or self.expects is not None

    def leave(self) -> None:
        """Note that the client disconnected before its answer."""
        self.client_left = True
