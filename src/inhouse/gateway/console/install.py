"""Mounting the console on the gateway's app: its pages, its stylesheet, and the usage API
(`GET /admin/api/usage`, for an admin key's Bearer token or a console session)."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from inhouse.api.errors import APIError, authentication_error
from inhouse.gateway.console import forms
from inhouse.gateway.console.pages import console_pages
from inhouse.gateway.console.session import Sessions
from inhouse.gateway.console.web import HERE, Web
from inhouse.gateway.handler import Gateway
from inhouse.gateway.keys import authenticate_admin
from inhouse.gateway.limits import Gcra, MemoryTatStore, SqlTatStore
from inhouse.gateway.usage.report import UnknownGrouping, as_csv, as_records, usage
from inhouse.http.errors import error_response
from inhouse.http.text_fields import TextFieldGuard


def install_console(app: FastAPI, gateway: Gateway) -> None:
    """Serve the console under /admin on `app`."""
    store = SqlTatStore(gateway.db) if gateway.config.shared_limits else MemoryTatStore()
    web = Web(Sessions(gateway.db, gateway.keys, Gcra(store, time.time)))
    app.include_router(console_pages(gateway, web))
    app.add_middleware(TextFieldGuard, prefix="/admin")  # every filter and form, before SQL
    stylesheet = (HERE / "static" / "console.css").read_bytes()

    @app.get("/admin/console.css", include_in_schema=False)
    async def css() -> Response:
        return Response(stylesheet, media_type="text/css",
                        headers={"cache-control": "max-age=3600"})  # fmt: skip

    @app.get("/admin/api/usage", include_in_schema=False)
    async def usage_api(request: Request) -> Response:
        """Usage per person, team, model, release, adapter or day: JSON, or CSV with format=csv."""
        try:
            await _admin(gateway, web, request)
            q = request.query_params
            since = time.time() - forms.duration(dict(q), "since", "30d")
            only = {f: q[f] for f in ("person", "team") if q.get(f)}
            rows = await asyncio.to_thread(usage, gateway.db, q.get("by", "person"), since,
                                           None, gateway.config.cost.charged, only)  # fmt: skip
        except APIError as err:
            return error_response(err)
        except (UnknownGrouping, forms.FormError) as err:
            return error_response(APIError(400, str(err), type="invalid_request_error"))
        if q.get("format") == "csv":
            return Response(as_csv(rows), media_type="text/csv")
        body = {"by": q.get("by", "person"), "since": since, "currency":
                gateway.config.cost.currency, "rows": as_records(rows)}  # fmt: skip
        return JSONResponse(body)


async def _admin(gateway: Gateway, web: Web, request: Request) -> None:
    """Pass a console session or an admin key's Bearer token; else 401, or 403 for a key
    that is not an admin's."""
    if await asyncio.to_thread(web.session, request) is not None:
        return
    headers = request.headers.getlist("authorization")
    if not headers:
        raise authentication_error("Sign in to the console or send an admin key.")
    await authenticate_admin(gateway.keys, headers)
