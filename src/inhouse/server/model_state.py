"""The chat model's state, in one object: loading, then ready or failed; a ready engine
that stops is dead. Its methods are the only writers and check each transition; a thread
waits for the outcome on an event instead of polling."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from inhouse.api.errors import service_unavailable

if TYPE_CHECKING:
    from inhouse.engine.async_engine import AsyncEngine
    from inhouse.engine.stats import EngineStats
    from inhouse.engine.structured import GrammarCompiler
    from inhouse.server.chat_template import ChatRenderer

STILL_LOADING = "The model is still loading; retry soon."


class Phase(StrEnum):
    """Where the chat model is: `/health` says each (ready as "ok")."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class LoadedChat:
    """What serving the chat model needs once it is loaded."""

    engine: AsyncEngine
    renderer: ChatRenderer
    grammars: GrammarCompiler


class ModelState:
    """loading -> ready | failed, and ready -> dead; `error` says why for the last two."""

    __slots__ = ("_error", "_loaded", "_lock", "_phase", "_settled")

    def __init__(self) -> None:
        self._phase = Phase.LOADING
        self._loaded: LoadedChat | None = None
        self._error: str | None = None
        self._lock = threading.Lock()
        self._settled = threading.Event()  # set once loading has ended, either way

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def loaded(self) -> LoadedChat | None:
        """The model once it was ready (a dead engine's too, for shutting it down)."""
        return self._loaded

    @property
    def error(self) -> str | None:
        """Why the model failed to load or stopped; None while loading or ready."""
        return self._error

    def ready(self, loaded: LoadedChat) -> None:
        """Loading finished: the model serves from now on."""
        with self._lock:
            self._move(Phase.LOADING, Phase.READY)
            self._loaded = loaded
        self._settled.set()

    def fail(self, message: str) -> None:
        """Loading failed: every model route and `/health` say `message` with a 503."""
        with self._lock:
            self._move(Phase.LOADING, Phase.FAILED)
            self._error = message
        self._settled.set()

    def die(self, reason: str) -> None:
        """The engine stopped: it cannot serve any more (said once; later calls keep it)."""
        with self._lock:
            if self._phase is Phase.DEAD:
                return
            self._move(Phase.READY, Phase.DEAD)
            self._error = f"The engine has stopped ({reason}); restart the server."

    def wait(self, timeout: float | None = None) -> Phase:
        """Block until loading has ended (or `timeout` seconds); the phase then."""
        self._settled.wait(timeout)
        return self._phase

    def require(self) -> LoadedChat:
        """The loaded model, or the 503 that says why there is none to serve."""
        loaded = self._loaded
        if self._phase is Phase.READY and loaded is not None:
            return loaded
        raise service_unavailable(self._error or STILL_LOADING)

    def engine_stats(self) -> EngineStats | None:
        """The engine's numbers once it is loaded, else None (for the metrics)."""
        return self._loaded.engine.stats() if self._loaded is not None else None

    def _move(self, source: Phase, target: Phase) -> None:
        if self._phase is not source:
            raise RuntimeError(f"the model cannot go from {self._phase} to {target}")
        self._phase = target
