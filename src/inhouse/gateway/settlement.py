"""The end of every request: an admitted one is settled exactly once (`Settler`: charge the
tokens it really used, free its replica slot and its key's slot), and every request,
admitted or refused, gets its metrics and its audit row (`Ledger`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from inhouse.api.errors import CLIENT_CLOSED, APIError
from inhouse.gateway.audit.writer import AuditRecord, AuditWriter, Redactor
from inhouse.gateway.call import Call, Outcome
from inhouse.gateway.holds import Charge
from inhouse.gateway.images import without_images
from inhouse.gateway.keys import ApiKey, KeyStore
from inhouse.gateway.metrics import GatewayMetrics
from inhouse.gateway.releases.answer_checks import NOT_CHECKED, AnswerChecks, check_answer
from inhouse.gateway.releases.metrics import ReleaseMetrics
from inhouse.gateway.state import GatewayState

DRAIN_SETTLE_S = 2.0


def final_status(call: Call, outcome: Outcome) -> int:
    """The status an admitted request ended with: the upstream's (or the error the gateway
    answered), or 499 when the client left before its answer was complete."""
    reached = call.lease is not None and outcome.status != 0
    return outcome.status if outcome.completed or not reached else CLIENT_CLOSED


def asked(model: Any, content: Any) -> str:
    """What the prompt hash is taken of: the model asked and the messages (or prompt)."""
    return json.dumps([model, content], sort_keys=True, default=str)


def answer_checks(call: Call, outcome: Outcome, status: int) -> AnswerChecks:
    """The checks of an answer that came back whole (`answer_checks`), for calls checked."""
    if call.expects is None or status != 200 or outcome.text is None:
        return NOT_CHECKED
    return check_answer(call.expects, "".join(outcome.text), outcome.calls())


class Ledger:
    """Writes what happened to each request: Prometheus metrics and one audit row."""

    def __init__(
        self, audit: AuditWriter, metrics: GatewayMetrics, redact: Redactor,
        releases: ReleaseMetrics,
    ) -> None:  # fmt: skip
        self.audit = audit
        self.metrics = metrics
        self.releases = releases
        self._redact = redact

    def prompt_text(self, key: ApiKey, body: dict[str, Any]) -> str | None:
        """The prompt to keep in the audit row (redacted), for keys that log content."""
        if not key.log_content:
            return None
        content = body.get("messages", body.get("prompt", body.get("input")))
        if isinstance(content, list) and "messages" in body:
            content = without_images(content)  # the audit keeps their count, never them
        return self._redact(content if isinstance(content, str) else json.dumps(content))

    def prompt_hash(self, keys: KeyStore, body: dict[str, Any]) -> str | None:
        """A peppered hash of what was asked (messages or prompt, and the model), so the
        cost report can tell a retry of the same task without the text being kept."""
        content = body.get("messages", body.get("prompt"))
        if content is None:
            return None
        return keys.hash(asked(body.get("model"), content))

    def refused(
        self, error: APIError, key: ApiKey | None, asked: tuple[str | None, str | None],
        endpoint: str, ts: float, started: float,
    ) -> None:  # fmt: skip
        """A request answered with an error before admission; `asked` is its model and
        adapter as far as they are known."""
        name, (model, adapter) = "" if key is None else key.name, asked
        self.metrics.refused(name, model, error.status_code, error.code or error.type)
        self.audit.record(
            AuditRecord(
                ts=ts,
                key_name=None if key is None else key.name,
                model=model,
                endpoint=endpoint,
                status=error.status_code,
                error_type=error.type,
                latency_ms=(time.perf_counter() - started) * 1000,
                team=None if key is None else key.team,
                adapter=adapter,
            )
        )

    def fell_back(self, model: str) -> None:
        """A request of `model` sent to its fallback."""
        self.metrics.fallbacks.labels(model).inc()

    def failed(self, call: Call, error: APIError) -> None:
        """An admitted request that ended in an error the gateway answered."""
        reason = "no_backend" if error.status_code == 503 else (error.code or error.type)
        self.metrics.failed(call.key.name, call.route.name, reason)

    def settled(self, call: Call, outcome: Outcome, prompt: int, completion: int) -> None:
        """An admitted request at its end, charged `prompt` + `completion` tokens."""
        end = time.perf_counter()
        name, model, lease = call.key.name, call.route.name, call.lease
        status = final_status(call, outcome)
        ttft = None if outcome.first_token_at is None else outcome.first_token_at - call.started
        self.metrics.observe_request(
            name, model, status, (prompt, completion), end - call.started, ttft
        )
        if outcome.prompt_tokens is not None:  # context creep on real tokens, not the estimate
            self.metrics.observe_prompt(model, outcome.prompt_tokens)
        pick = call.release
        if pick is not None:
            self.releases.observe(call.release_name, pick.answering.candidate, status, ttft)
        checks = answer_checks(call, outcome, status)
        if call.shadow is not None:
            call.shadow.primary_settled(status, outcome, end - call.started, ttft, checks)
        answer = None if outcome.text is None else "".join(outcome.text)
        text = None  # collected for the release checks too, but kept only for `log_content`
        if answer is not None and call.key.log_content:
            text = self._redact(answer)
        self.audit.record(
            AuditRecord(
                ts=call.ts,
                key_name=name,
                model=model,
                endpoint=call.endpoint,
                status=status,
                backend=None if lease is None else lease.upstream.name,
                error_type=outcome.error_type,
                stream=call.stream,
                prompt_tokens=prompt,
                completion_tokens=completion,
                reserved_tokens=call.reserve,
                latency_ms=(end - call.started) * 1000,
                ttft_ms=None if ttft is None else ttft * 1000,
                finish_reason=outcome.finish_reason,
                fallback_used=lease is not None and lease.fallback,
                prompt_text=call.prompt_text,
                completion_text=text,
                release=None if pick is None else pick.answering.number,
                json_valid=checks.json_valid,
                refusal=checks.refusal,
                tool_calls_valid=checks.tool_calls_valid,
                team=call.key.team,
                prompt_hash=call.prompt_hash,
                priority=call.priority,
                degraded_from=call.degraded_from,
                hold=call.hold,
                adapter=call.adapter,
                images=call.needs.images or None,
            )
        )


def charge(call: Call, outcome: Outcome) -> tuple[int, int]:
    """Prompt and completion tokens to charge: the upstream's usage; for an answer cut off
    before it (if it reached an upstream), the prompt as counted after the cut (else as
    reserved) and one token per content chunk relayed."""
    if not call.metered:
        return 0, 0
    reached = call.lease is not None and outcome.status != 0
    prompt = outcome.prompt_tokens
    if prompt is None:
        counted = call.prompt if outcome.prompt_counted is None else outcome.prompt_counted
        prompt = counted if reached else 0
    completion = outcome.completion_tokens
    if completion is None:
        completion = outcome.content_chunks
    return prompt, completion


@dataclass(slots=True)
class Settler:
    """Settles each admitted call exactly once and counts those still open."""

    state: GatewayState
    ledger: Ledger
    active: int = field(default=0, init=False)  # admitted calls not yet settled
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    def opened(self) -> None:
        """Count a call just admitted."""
        self.active += 1

    def settle(self, call: Call, outcome: Outcome) -> None:
        """End `call`: the ledger's row at once; rate limits inline when they live in memory,
        else in a task that `drain` waits for, as is the hold's settlement (`holds`). A
        second call does nothing."""
        if call.settled:
            return
        call.settled = True
        self.active -= 1
        if call.lease is not None:
            self.state.router.release(call.lease)
        prompt, completion = charge(call, outcome)
        self.ledger.settled(call, outcome, prompt, completion)
        charged = prompt + completion
        if call.hold is not None:
            money = self.state.prices.of(prompt, completion)
            settled = Charge(call.hold, charged, money)
            self._spawn(asyncio.to_thread(self.state.holds.settle, settled))
        if self.state.limits.blocking:
            self._spawn(self._settle_limits(call, charged))
            return
        self.state.limiter.settle(call.key, call.reserve, charged)
        self.state.limiter.release(call.key)

    async def _settle_limits(self, call: Call, charged: int) -> None:
        await self.state.limits(self.state.limiter.settle, call.key, call.reserve, charged)
        self.state.limiter.release(call.key)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = DRAIN_SETTLE_S) -> None:
        """On shutdown: let cancelled calls settle (bounded), then wait for settlements."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.active:
                    await asyncio.sleep(0.01)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
