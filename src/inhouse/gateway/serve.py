"""Run the gateway under uvicorn, with an access log that never shows query strings."""

from __future__ import annotations

import contextlib
import logging

from inhouse.gateway.config import GatewayConfig


class DropQueryStrings(logging.Filter):
    """uvicorn's access log prints the full path; keep only the path part."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) >= 3:
            args = list(record.args)
            args[2] = str(args[2]).split("?", 1)[0]
            record.args = tuple(args)
        return True


def run_gateway(config: GatewayConfig) -> None:
    """Build the gateway from its config and serve it until interrupted."""
    import uvicorn

    from inhouse.gateway.app import build_gateway, create_app

    app = create_app(build_gateway(config))
    logging.getLogger("uvicorn.access").addFilter(DropQueryStrings())
    # uvicorn re-raises Ctrl-C after its graceful shutdown (audit rows are flushed by then).
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(app, host=config.host, port=config.port, log_level="info")
