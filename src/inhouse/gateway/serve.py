"""Run the gateway under uvicorn, with its own access log (see `access_log`)."""

from __future__ import annotations

import contextlib

from inhouse.gateway.config import GatewayConfig


def run_gateway(config: GatewayConfig) -> None:
    """Build the gateway from its config and serve it until interrupted."""
    import uvicorn

    from inhouse.gateway.access_log import AccessLog
    from inhouse.gateway.app import build_gateway, create_app

    access_log = AccessLog() if config.access_log else None
    app = create_app(build_gateway(config), access_log)
    # On SIGTERM/Ctrl-C uvicorn stops accepting, lets requests in flight finish for up to
    # `drain_timeout_s`, then cancels the rest (each cancels its upstream request and writes
    # its audit row), and re-raises Ctrl-C when done.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(
            app,
            host=config.host,
            port=config.port,
            log_level="info",
            access_log=False,
            timeout_graceful_shutdown=config.drain_timeout_s,
        )
