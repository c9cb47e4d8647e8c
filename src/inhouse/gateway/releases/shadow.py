"""Shadow traffic: a share of the stable release's requests is sent to the candidate too,
and the two answers are stored side by side; the client only ever gets the primary's.

The copy starts with the primary and runs in its own task with its own timeout; it is
streamed from the candidate (so its TTFT is known) and read to the end. At most
`shadow_max_in_flight` copies run at once: a copy over the bound is dropped and counted,
never queued. The pair is stored when both ends are in (in batches, every `FLUSH_AFTER_S`);
nothing of it is on the primary's path. A pair holds text only when the key logs content
(redacted); otherwise only lengths, finish reasons, the answer checks of both sides (JSON
and tool-call validity, refusal: `answer_checks`), whether the answers are identical (text
and tool calls), the timings and the prompt's peppered hash. A key that forbids fallback is
never mirrored to a hosted (`openai` kind) candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert

from inhouse.gateway.audit.writer import Redactor
from inhouse.gateway.backends import Backend
from inhouse.gateway.call import Call, Outcome
from inhouse.gateway.config import ReleaseSettings
from inhouse.gateway.db import shadow_pairs
from inhouse.gateway.db_values import column_cleaners
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.exchange import UpstreamClients, prepare, relay_events
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.releases.answer_checks import NOT_CHECKED, AnswerChecks, check_answer
from inhouse.gateway.releases.canary import Answering, apply_release, capped
from inhouse.gateway.releases.metrics import ReleaseMetrics
from inhouse.gateway.seats import takes

log = logging.getLogger("inhouse.gateway.shadow")
# A pair holds what the candidate answered: one odd value must not lose the batch it is in.
_PAIR_CLEANERS = column_cleaners(shadow_pairs, tuple(c.name for c in shadow_pairs.c))

FLUSH_AFTER_S = 0.5  # pairs are inserted in batches: one statement per half second
SHADOW_CLASS = "batch"  # a mirrored copy is extra work: it never goes before real requests


@dataclass(frozen=True, slots=True)
class Primary:
    """How the client's own request ended."""

    status: int
    outcome: Outcome
    latency_s: float
    ttft_s: float | None
    checks: AnswerChecks = NOT_CHECKED


class ShadowTicket:
    """The link between a call and its copy: the call's settlement hands over its end."""

    def __init__(self) -> None:
        self.primary: asyncio.Future[Primary] = asyncio.get_running_loop().create_future()

    def primary_settled(
        self, status: int, outcome: Outcome, latency_s: float, ttft_s: float | None,
        checks: AnswerChecks,
    ) -> None:  # fmt: skip
        """Hand over how the client's own request ended (its settlement calls this once)."""
        if not self.primary.done():
            self.primary.set_result(Primary(status, outcome, latency_s, ttft_s, checks))


@dataclass(slots=True)
class _Copy:
    """One mirrored request's end."""

    status: int = 0
    error: str | None = None
    latency_s: float | None = None
    ttft_s: float | None = None


class ShadowMirror:
    """Starts copies of calls whose pick names a shadow, within the bound."""

    def __init__(
        self, db: Engine, keys: KeyStore, upstreams: UpstreamClients, metrics: ReleaseMetrics,
        settings: ReleaseSettings, redact: Redactor, primary_wait_s: float,
    ) -> None:  # fmt: skip
        self._db, self._keys, self._upstreams = db, keys, upstreams
        self._metrics, self._settings, self._redact = metrics, settings, redact
        self._primary_wait = primary_wait_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: list[dict[str, Any]] = []  # pairs to insert, every FLUSH_AFTER_S
        self._flush: asyncio.Future[None] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def start(self, call: Call, body: dict[str, Any]) -> None:
        """Mirror `call` to its pick's shadow, unless the key, the endpoint, the bound or the
        candidate's health say no (each counted)."""
        target = None if call.release is None else call.release.shadow
        if target is None:
            return
        model = call.release_name
        if not ENDPOINTS[call.endpoint].generates or not _may_mirror(call, target):
            self._metrics.shadow.labels(model, "skipped").inc()
            return
        if len(self._tasks) >= self._settings.shadow_max_in_flight:
            self._metrics.shadow.labels(model, "dropped").inc()
            return
        seats = call.route.interactive_seats
        ready = [b for b in target.replicas(call.adapter) if takes(b, SHADOW_CLASS, seats)]
        if not ready:
            self._metrics.shadow.labels(model, "skipped").inc()
            return
        backend = min(ready, key=Backend.load)
        backend.in_flight += 1
        ticket = call.shadow = ShadowTicket()
        self._metrics.shadow.labels(model, "sent").inc()
        task = asyncio.ensure_future(self._mirror(call, body, target, backend, ticket))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mirror(
        self, call: Call, body: dict[str, Any], target: Answering, backend: Backend,
        ticket: ShadowTicket,
    ) -> None:  # fmt: skip
        outcome, copy = Outcome(text=[]), _Copy()
        started = time.perf_counter()
        try:
            await self._send(call, body, target, backend, outcome, copy, started)
        finally:
            backend.in_flight -= 1
        if copy.error is not None:
            self._metrics.shadow.labels(call.release_name, copy.error).inc()
        try:
            primary = await asyncio.wait_for(asyncio.shield(ticket.primary), self._primary_wait)
        except TimeoutError:
            return
        self._pending.append(self._pair(call, target, primary, outcome, copy))
        if self._flush is None or self._flush.done():
            self._flush = asyncio.ensure_future(self.flush(FLUSH_AFTER_S))

    async def _send(
        self, call: Call, body: dict[str, Any], target: Answering, backend: Backend,
        outcome: Outcome, copy: _Copy, started: float,
    ) -> None:  # fmt: skip
        streamed = {**body, "stream": True}
        forward = prepare(
            backend.upstream, call.endpoint, apply_release(streamed, target),
            self._keys.cache_salt(call.key), capped(call.output_cap, target),
            SHADOW_CLASS, target.sends(call.adapter),
        )  # fmt: skip
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(self._settings.shadow_timeout_s):
                    upstream = await self._upstreams.open(forward, stack)
                    copy.status = upstream.status
                    if upstream.status == 200:
                        async for _ in relay_events(upstream.iter_body(), outcome, True):
                            pass
                        copy.status = outcome.status or 200
                    else:
                        await upstream.read()
                        copy.error = "failed"
        except TimeoutError:
            copy.status, copy.error = 504, "timeout"
        except OSError:
            copy.status, copy.error = 502, "failed"
        copy.latency_s = time.perf_counter() - started
        if outcome.first_token_at is not None:
            copy.ttft_s = outcome.first_token_at - started

    def _pair(
        self, call: Call, target: Answering, primary: Primary, outcome: Outcome, copy: _Copy
    ) -> dict[str, Any]:
        assert call.release is not None
        mine = None if primary.outcome.text is None else "".join(primary.outcome.text)
        theirs = "".join(outcome.text or ()) if copy.status == 200 else None
        checks = NOT_CHECKED
        if theirs is not None and call.expects is not None:
            checks = check_answer(call.expects, theirs, outcome.calls())
        same = None
        if mine is not None and theirs is not None:
            same = (mine, primary.outcome.calls()) == (theirs, outcome.calls())
        keep = call.key.log_content
        pair = {
            "ts": call.ts,
            "model": call.release_name,
            "primary_release": call.release.answering.number,
            "shadow_release": target.number,
            "key_name": call.key.name,
            "endpoint": call.endpoint,
            "primary_status": primary.status,
            "shadow_status": copy.status,
            "shadow_error": copy.error,
            "primary_finish": primary.outcome.finish_reason,
            "shadow_finish": outcome.finish_reason,
            "primary_tokens": primary.outcome.completion_tokens,
            "shadow_tokens": outcome.completion_tokens,
            "primary_latency_ms": primary.latency_s * 1000,
            "shadow_latency_ms": None if copy.latency_s is None else copy.latency_s * 1000,
            "primary_ttft_ms": None if primary.ttft_s is None else primary.ttft_s * 1000,
            "shadow_ttft_ms": None if copy.ttft_s is None else copy.ttft_s * 1000,
            "exact_match": same,
            "primary_json_valid": primary.checks.json_valid,
            "shadow_json_valid": checks.json_valid,
            "primary_refusal": primary.checks.refusal,
            "shadow_refusal": checks.refusal,
            "primary_tool_calls_valid": primary.checks.tool_calls_valid,
            "shadow_tool_calls_valid": checks.tool_calls_valid,
            "prompt_hash": call.prompt_hash,
            "primary_text": self._redact(mine) if keep and mine is not None else None,
            "shadow_text": self._redact(theirs) if keep and theirs is not None else None,
        }
        return {name: _PAIR_CLEANERS[name](value) for name, value in pair.items()}

    async def flush(self, after_s: float = 0.0) -> None:
        """Insert the pairs waiting (after `after_s`), in one statement."""
        await asyncio.sleep(after_s)
        rows, self._pending = self._pending, []
        if not rows:
            return
        try:
            await asyncio.to_thread(self._insert, rows)
        except Exception as exc:  # lost pairs are lost samples, never a failed request
            log.warning("shadow: could not store %d pair(s) (%s)", len(rows), type(exc).__name__)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        with self._db.begin() as conn:
            conn.execute(insert(shadow_pairs), rows)

    async def drain(self) -> None:
        """On shutdown: stop the copies still running (their pairs are not written) and
        store the pairs already made."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.flush()


def _may_mirror(call: Call, target: Answering) -> bool:
    """A key that forbids fallback keeps its data in house: no hosted candidate."""
    return call.key.allow_fallback or all(b.upstream.kind != "openai" for b in target.pool)
