"""What the routes need, in one object per app: config, the model's state, helpers."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inhouse.api.errors import APIError, not_found, service_unavailable
from inhouse.http.body_limit import DEFAULT_MAX_BODY_BYTES
from inhouse.plan.vision import DEFAULT_IMAGES_PER_PROMPT
from inhouse.server.memory import HeapTrimmer
from inhouse.server.metrics import ServerMetrics
from inhouse.server.model_state import ModelState
from inhouse.server.workers import GRAMMAR_THREADS, PROMPT_THREADS, WorkerPool

if TYPE_CHECKING:
    from inhouse.engine.async_engine import AsyncEngine
    from inhouse.engine.embedding_scheduler import EmbeddingScheduler
    from inhouse.engine.stats import EmbeddingStats
    from inhouse.manifests.manifest import Manifest


@dataclass(frozen=True, slots=True)
class ManifestStatus:
    """What ``/version`` and the start-up table say about the model's manifest."""

    path: str | None = None
    revision: str | None = None
    verified: bool = False  # every file's sha256 matched before loading

    @classmethod
    def of(cls, manifest: Manifest | None) -> ManifestStatus:
        """The status of a manifest that was verified, or of none (not verified)."""
        if manifest is None:
            return cls()
        return cls(str(manifest.path), manifest.revision, verified=True)

    def describe(self) -> str:
        """One line for the start-up table."""
        if self.path is None:
            return "none (files not verified; see inhouse models lock)"
        return f"{self.path}, revision {self.revision}, verified"


@dataclass(slots=True)
class ServerConfig:
    """The server's own settings (the engine's are in ``EngineConfig``)."""

    served_model_name: str | None = None
    api_key: str | None = None
    chat_template: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    embedding_model: Path | None = None
    embedding_model_name: str | None = None
    manifest: ManifestStatus = field(default_factory=ManifestStatus)
    images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT  # a vision model's --limit-mm-per-prompt
    allowed_media_domains: frozenset[str] = frozenset()  # hosts whose image URLs are fetched

    @property
    def embedding_name(self) -> str | None:
        """The name the embedding model is served under, or None without one."""
        if self.embedding_model is None:
            return None
        return self.embedding_model_name or self.embedding_model.name


def _loading() -> Future:
    """A future the loader completes; running already, so no waiter can cancel it."""
    future: Future = Future()
    future.set_running_or_notify_cancel()
    return future


def _embedding_stats(embeddings: Future[EmbeddingScheduler]) -> EmbeddingStats | None:
    """The embedding scheduler's numbers once it is running, else None."""
    ready = embeddings.done() and embeddings.exception() is None
    return embeddings.result().stats() if ready else None


@dataclass(slots=True)
class ServerContext:
    """Shared state of one app. ``model`` says whether the chat model is loading, ready,
    failed or dead; the embedding model loads after it (``embeddings`` completes then).
    Tokenizing and templates run on ``prompt_workers``, schema compiles on
    ``grammar_workers``; ``heap`` gives back what heavy requests freed."""

    config: ServerConfig
    metrics: ServerMetrics
    model_name: str
    heap: HeapTrimmer
    prompt_workers: WorkerPool
    grammar_workers: WorkerPool
    model: ModelState
    embeddings: Future[EmbeddingScheduler]
    started_at: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def create(cls, config: ServerConfig, model_name: str) -> ServerContext:
        """A context whose metrics read the engine's stats once it is loaded, and whose
        worker pools have the heap trimmed after their jobs."""
        heap = HeapTrimmer()
        model, embeddings = ModelState(), _loading()
        metrics = ServerMetrics(
            model_name,
            model.engine_stats,
            lambda: _embedding_stats(embeddings),
            config.embedding_name,
        )
        return cls(
            config=config,
            metrics=metrics,
            model_name=model_name,
            heap=heap,
            prompt_workers=WorkerPool("prompt", PROMPT_THREADS, after=heap.note),
            grammar_workers=WorkerPool("grammar", GRAMMAR_THREADS, after=heap.note),
            model=model,
            embeddings=embeddings,
        )

    def require_engine(self) -> AsyncEngine:
        """The engine, or a 503 while it is still loading, or if it failed to load or died."""
        return self.model.require().engine

    def check_model(self, requested: str | None) -> str | None:
        """The LoRA adapter a request's ``model`` names (None: the base model), or a 404 when
        it names neither the base nor a loaded adapter."""
        if requested is None or requested == self.model_name:
            return None
        loaded = self.model.loaded
        if loaded is not None and any(a.name == requested for a in loaded.engine.adapters()):
            return requested
        raise not_found(
            f"The model {requested!r} does not exist; this server serves {self.model_name!r}"
            " and its loaded LoRA adapters (GET /v1/models).",
            param="model",
            code="model_not_found",
        )

    def answer_name(self, adapter: str | None) -> str:
        """The ``model`` a response names: the adapter it ran with, else the base."""
        return adapter or self.model_name

    async def embedding_model(self, requested: str | None) -> EmbeddingScheduler:
        """The embedding scheduler for ``requested`` (or the default) once loaded, or a
        404/400/503."""
        name = self.config.embedding_name
        if name is None:
            raise APIError(
                400, "This server has no embedding model (started with --embedding-model none)."
            )
        if requested is not None and requested != name:
            raise not_found(
                f"The model {requested!r} does not exist; embeddings are served by {name!r}.",
                param="model",
                code="model_not_found",
            )
        try:
            return await asyncio.shield(asyncio.wrap_future(self.embeddings))
        except Exception as exc:
            raise service_unavailable(f"The embedding model failed to load: {exc}") from None
