"""The FastAPI app factory: routes, error handlers, body limit, background model loading."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from inhouse import __version__
from inhouse.http.body_limit import BodySizeLimit
from inhouse.server.context import ServerContext
from inhouse.server.errors import ModelRefused, install_error_handlers
from inhouse.server.routes import adapters, chat, completions, embeddings, info

log = logging.getLogger(__name__)

Loader = Callable[[ServerContext], None]


def build_app(ctx: ServerContext, load: Loader | None = None) -> FastAPI:
    """An app over ``ctx``. ``load`` makes ``ctx.model`` ready in a thread after start-up;
    until it does, /health says 503 and model routes answer 503."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_load(ctx, load)) if load else None
        ctx.heap.start()
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            if ctx.model.loaded is not None:
                await ctx.model.loaded.engine.shutdown()
            ctx.heap.close()
            ctx.prompt_workers.shutdown()
            ctx.grammar_workers.shutdown()
            if ctx.embeddings.done() and ctx.embeddings.exception() is None:
                await asyncio.to_thread(ctx.embeddings.result().close)

    app = FastAPI(
        title="inhouse",
        lifespan=lifespan,
        version=__version__,
        docs_url=None,
        redoc_url=None,
    )
    app.state.context = ctx
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=ctx.config.max_body_bytes)
    for module in (chat, completions, embeddings, adapters):
        app.include_router(module.router)
    app.include_router(info.router)
    app.include_router(info.authorized)
    return app


async def _load(ctx: ServerContext, load: Loader) -> None:
    """Run ``load``; a failure fails ``ctx.model`` (with a traceback in the log unless the
    model was refused, which the error says in full)."""
    try:
        await asyncio.to_thread(load, ctx)
    except Exception as exc:
        if not isinstance(exc, ModelRefused):
            log.exception("loading the model failed")
        ctx.model.fail(f"Loading the model failed: {exc}")
