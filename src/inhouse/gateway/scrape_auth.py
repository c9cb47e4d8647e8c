"""Who may read what the gateway knows of its keys and backends.

With `gateway.metrics_token_env` set, `GET /metrics` and `/metrics/targets` (key names,
backend addresses) need `Authorization: Bearer <that token>`, and `GET /health` without it
says only whether each model is up. Without the setting all three are public, as before.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from inhouse.api.errors import authentication_error
from inhouse.gateway.config import GatewayConfig
from inhouse.http.errors import error_response


def may_scrape(config: GatewayConfig, request: Request) -> bool:
    """Whether `request` may read key names and backend addresses."""
    if config.metrics_token is None:
        return True
    presented = request.headers.getlist("authorization")
    expected = f"Bearer {config.metrics_token}".encode()
    return len(presented) == 1 and hmac.compare_digest(presented[0].encode(), expected)


def scrape_refused() -> Response:
    """401 in OpenAI's shape for a scrape without the metrics token."""
    refused = authentication_error("This route needs the gateway's metrics token.")
    return error_response(refused, {"www-authenticate": "Bearer"})


def public_health(body: dict[str, Any]) -> dict[str, Any]:
    """What `/health` tells anyone: the overall status and each model's, nothing of its
    backends (names, addresses, errors)."""
    models = {name: {"status": model["status"]} for name, model in body["models"].items()}
    return {"status": body["status"], "models": models}
