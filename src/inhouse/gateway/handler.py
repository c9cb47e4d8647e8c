"""One request through the gateway, step by step: authenticate (`authn`) → parse (`parse`) →
admit (`admit`) → route and relay (`forward`) → settle (`settle`) → audit (`ledger`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy import Engine
from starlette.responses import Response
from starlette.types import Receive

from inhouse.api.body import json_object
from inhouse.api.errors import APIError, server_error
from inhouse.gateway.admit import Admitter, Refusal
from inhouse.gateway.answer_checks import Expectations
from inhouse.gateway.audit import AuditWriter, Redactor
from inhouse.gateway.authn import authenticate
from inhouse.gateway.call import Outcome
from inhouse.gateway.canary import ReleaseRouter
from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.degrade import Degrader
from inhouse.gateway.forward import Forwarder
from inhouse.gateway.keys import ApiKey, KeyStore
from inhouse.gateway.ledger import Ledger
from inhouse.gateway.limits import KeyLimiter, LimitCalls
from inhouse.gateway.metrics import GatewayMetrics
from inhouse.gateway.parse import model_name, parse
from inhouse.gateway.proxy import GENERATING_ENDPOINTS, UpstreamClients
from inhouse.gateway.release_metrics import ReleaseMetrics
from inhouse.gateway.releases import ReleaseStore
from inhouse.gateway.routing import Router
from inhouse.gateway.settle import Settler
from inhouse.gateway.shadow import ShadowMirror
from inhouse.gateway.teams import TeamStore
from inhouse.http.errors import error_response

log = logging.getLogger("inhouse.gateway")


class Gateway:
    """The request path over the objects that hold the gateway's state."""

    def __init__(
        self,
        config: GatewayConfig,
        keys: KeyStore,
        limiter: KeyLimiter,
        router: Router,
        audit: AuditWriter,
        metrics: GatewayMetrics,
        upstreams: UpstreamClients,
        limits_block: bool,
        releases: ReleaseStore,
        teams: TeamStore,
        db: Engine,
    ) -> None:
        self.config = config
        self.keys = keys
        self.limiter = limiter
        self.router = router
        self.audit = audit
        self.metrics = metrics
        self.upstreams = upstreams
        self.teams = teams
        self.db = db  # the shared database (the console's usage, cost and audit pages)
        limits = LimitCalls(limits_block)
        redact = Redactor(config.audit.redact, [*config.held_secrets(), keys.pepper_text])
        self.release_metrics = ReleaseMetrics(metrics.registry, [m.name for m in config.models])
        self.releases = ReleaseRouter(releases, router, self.release_metrics.show)
        self.shadow = ShadowMirror(
            releases.db, keys, upstreams, self.release_metrics, config.releases, redact,
            config.request_timeout_s,
        )  # fmt: skip
        prices = config.cost.charged
        self.ledger = Ledger(audit, metrics, redact, self.release_metrics)
        self.settler = Settler(keys, limiter, limits, router, self.ledger, teams, prices)
        self.admitter = Admitter(keys, limiter, limits, router, upstreams, teams, prices)
        self.degrader = Degrader(config, router, metrics)
        self.forwarder = Forwarder(
            keys, router, upstreams, self.settler, self.ledger, config.health,
            config.request_timeout_s,
        )  # fmt: skip

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
        model: str | None = None
        try:
            key = await authenticate(self.keys, authorization)
            body = json_object(raw)
            model = model_name(body)
            request = parse(self.config, self.router, key, endpoint, body, model)
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
            call.release = await self.releases.pick(key, call.route)
            if call.release is not None and endpoint in GENERATING_ENDPOINTS:
                call.expects = Expectations.of(body)
            self.shadow.start(call, body)
            response = await self.forwarder.forward(call, body, receive)
            if log_fields is not None and call.release is not None:
                log_fields["release"] = f"{call.route.name}@{call.release.answering.number}"
            return response
        except Exception:  # a bug must not leak the key's slots: answer 500 and settle
            log.exception("gateway: request to model %r failed", call.route.name)
            return self.forwarder.fail(call, Outcome(), server_error())

    def _refuse(
        self, refusal: Refusal, key: ApiKey | None, model: str | None, endpoint: str, ts: float,
        started: float,
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
