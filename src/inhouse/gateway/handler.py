"""One request through the gateway, step by step: authenticate (`keys`) → parse (`parsing`;
an adapter's key and team lists: `adapters.policy`) → admit (`admission`) → route and relay
(`upstream`) → settle and audit (`settlement`)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence

from starlette.responses import Response
from starlette.types import Receive

from inhouse.api.body import json_object
from inhouse.api.errors import APIError, server_error
from inhouse.gateway.adapters.policy import AdapterPolicy
from inhouse.gateway.admission import Admitter, Refusal, count_cut_prompt
from inhouse.gateway.audit.writer import Redactor
from inhouse.gateway.degrade import Degrader
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.keys import ApiKey, authenticate
from inhouse.gateway.parsing import model_name, parse
from inhouse.gateway.releases.answer_checks import Expectations
from inhouse.gateway.releases.canary import ReleaseRouter
from inhouse.gateway.releases.metrics import ReleaseMetrics
from inhouse.gateway.releases.shadow import ShadowMirror
from inhouse.gateway.releases.store import ReleaseStore
from inhouse.gateway.settlement import Ledger, Settler
from inhouse.gateway.state import GatewayState
from inhouse.gateway.upstream import Forwarder
from inhouse.http.errors import error_response

log = logging.getLogger("inhouse.gateway")


class Gateway:
    """The request path over the objects that hold the gateway's state."""

    def __init__(self, state: GatewayState, releases: ReleaseStore) -> None:
        self.state = state
        self.config, self.keys, self.limiter, self.router = (
            state.config,
            state.keys,
            state.limiter,
            state.router,
        )
        self.audit, self.metrics, self.upstreams = state.audit, state.metrics, state.upstreams
        self.teams = state.teams
        self.db = state.db  # the shared database (the console's usage, cost and audit pages)
        config, keys = state.config, state.keys
        redact = Redactor(config.audit.redact, [*config.held_secrets(), keys.pepper_text])
        names = [m.name for m in config.models]
        self.release_metrics = ReleaseMetrics(state.metrics.registry, names)
        self.releases = ReleaseRouter(releases, state.router, self.release_metrics.show)
        self.shadow = ShadowMirror(
            releases.db, keys, state.upstreams, self.release_metrics, config.releases, redact,
            config.request_timeout_s,
        )  # fmt: skip
        self.ledger = Ledger(state.audit, state.metrics, redact, self.release_metrics)
        self.settler = Settler(state, self.ledger)
        self.admitter = Admitter(state)
        self.degrader = Degrader(config, state.router, state.metrics)
        self.adapters = AdapterPolicy(state.teams, keys.lookup_is_local)
        cut = functools.partial(count_cut_prompt, state)
        self.forwarder = Forwarder(state, self.settler, self.ledger, cut)

    async def authenticate(self, authorization: Sequence[str]) -> ApiKey:
        """The live key named by the request's Authorization headers, or an APIError."""
        return await authenticate(self.keys, authorization)

    async def handle(
        self, authorization: Sequence[str], raw: bytes, endpoint: str,
        receive: Receive | None = None, log_fields: dict[str, str] | None = None,
    ) -> Response:  # fmt: skip
        """Answer one OpenAI API call (its Authorization headers and body) on behalf of a key.

        With `receive`, a non-streamed request whose client disconnects is cancelled upstream.
        `log_fields` gets the access log's extra fields (the release that answered).
        """
        ts, started = time.time(), time.perf_counter()
        key: ApiKey | None = None
        model: tuple[str | None, str | None] = (None, None)  # as audited: model, adapter
        try:
            key = await authenticate(self.keys, authorization)
            body = json_object(raw)
            model = (model_name(body), None)
            request = parse(self.config, self.router, key, endpoint, body, model[0])
            if request.adapter is not None:
                model = (request.route.name, request.adapter)
                await self.adapters.check(key, request.adapter)
        except APIError as err:
            return self._refuse(Refusal(err), key, model, endpoint, ts, started)
        prompt_text = self.ledger.prompt_text(key, body)
        call = await self.admitter.admit(key, request, ts, started, prompt_text)
        if isinstance(call, Refusal):
            return self._refuse(call, key, model, endpoint, ts, started)
        call.prompt_hash = self.ledger.prompt_hash(self.keys, body)
        self.settler.opened()
        try:
            self.degrader.apply(call)
            call.release = await self.releases.pick(key, call.route, call.adapter)
            if call.release is not None and ENDPOINTS[endpoint].generates:
                call.expects = Expectations.of(body)
            self.shadow.start(call, body)
            response = await self.forwarder.forward(call, body, receive)
            if log_fields is not None and call.release is not None:
                log_fields["release"] = f"{call.release_name}@{call.release.answering.number}"
            return response
        except Exception:  # a bug must not leak the key's slots: answer 500 and settle
            log.exception("gateway: request to model %r failed", call.route.name)
            return self.forwarder.fail(call, None, server_error())

    def _refuse(
        self, refusal: Refusal, key: ApiKey | None, model: tuple[str | None, str | None],
        endpoint: str, ts: float, started: float,
    ) -> Response:  # fmt: skip
        self.ledger.refused(refusal.error, key, model, endpoint, ts, started)
        headers = refusal.headers
        if key is not None and headers is None:
            headers = self.limiter.headers(key)
        return error_response(refusal.error, headers, refusal.retry_after_s)

    async def drain(self) -> None:
        """On shutdown: let cancelled requests settle (bounded), then wait for settlements;
        mirrored copies still running are stopped."""
        await self.settler.drain()
        await self.shadow.drain()
