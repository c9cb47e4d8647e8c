"""Run the gateway under uvicorn, with its own access log (see `access_log`)."""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING

from inhouse.gateway.config import GatewayConfig

if TYPE_CHECKING:
    from collections.abc import Sequence

    import uvicorn

    from inhouse.gateway.app import Background


def gateway_server(config: GatewayConfig, background: Sequence[Background] = ()) -> uvicorn.Server:
    """The gateway as a uvicorn server (`inhouse up` stops it when no replica starts), with
    `background` loops on its event loop (`app.create_app`)."""
    import uvicorn

    from inhouse.gateway.access_log import AccessLog
    from inhouse.gateway.app import build_gateway, create_app

    access_log = AccessLog() if config.access_log else None
    app = create_app(build_gateway(config), access_log, background)
    # What start-up built (imports, config, routes: ~80k objects) lives as long as the
    # process; frozen, it stays out of every later collection a request's garbage triggers.
    gc.freeze()
    settings = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=config.drain_timeout_s,
        timeout_keep_alive=config.keep_alive_s,  # see `config_values.KEEP_ALIVE_S`
        # X-Forwarded-For names the client only when a trusted proxy sent it; uvicorn's
        # default would trust it from any client on loopback.
        proxy_headers=bool(config.trusted_proxies),
        forwarded_allow_ips=list(config.trusted_proxies),
    )
    return uvicorn.Server(settings)


def run_gateway(config: GatewayConfig, server: uvicorn.Server | None = None) -> None:
    """Serve the gateway until interrupted (or until `server.should_exit` is set)."""
    # On SIGTERM/Ctrl-C uvicorn stops accepting, lets requests in flight finish for up to
    # `drain_timeout_s`, then cancels the rest (each cancels its upstream request and writes
    # its audit row), and re-raises Ctrl-C when done.
    with contextlib.suppress(KeyboardInterrupt):
        (server or gateway_server(config)).run()
