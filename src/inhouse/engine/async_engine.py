"""AsyncEngine: the LLMEngine step loop in its own thread, per-request async streams.

The asyncio side never waits on a forward pass: ``generate`` validates at once
(raising EngineInputError before anything is scheduled), hands the request to the
loop thread, and awaits deltas on its own queue. ``abort`` (also triggered when the
consumer of ``generate`` stops iterating or is cancelled) is applied by the loop
before its next step, which frees the request's blocks.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.errors import EngineInputError
from inhouse.engine.models.loader import LoadedModel
from inhouse.engine.outputs import RequestOutput
from inhouse.engine.sampling import SamplingParams
from inhouse.engine.stats import EngineStats

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed while running this request."""


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None


@dataclass(slots=True)
class _Abort:
    request_id: str


class AsyncEngine:
    """Serves many concurrent ``generate`` calls from one background step loop."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.engine = LLMEngine(config, loaded)
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._stats = self.engine.stats()
        self._thread: threading.Thread | None = None

    # -- facts the server shows -------------------------------------------------------

    @property
    def loaded(self) -> LoadedModel:
        return self.engine.loaded

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def chat_template(self) -> str | None:
        return self.engine.loaded.chat_template

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def model_id(self) -> str:
        return self.engine.loaded.model_id

    def stats(self) -> EngineStats:
        """The snapshot taken after the loop's latest step."""
        return self._stats

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="inhouse-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the loop; requests still running end with EngineDeadError."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._commands.put(None)
        await asyncio.to_thread(thread.join)

    # -- requests ---------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas as they come; the last one has ``finished`` set."""
        stream = self._open(request_id, prompt_token_ids, params, cache_salt)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            with self._streams_lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def _open(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None,
    ) -> _Stream:
        if self._thread is None:
            raise RuntimeError("AsyncEngine.start() was not called")
        self.engine.validate_request(request_id, prompt_token_ids, params, cache_salt)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._streams_lock:
            if request_id in self._streams:
                raise EngineInputError(f"request id {request_id!r} is already running")
            self._streams[request_id] = stream
        self._commands.put(_Add(request_id, list(prompt_token_ids), params, cache_salt))
        return stream

    def abort(self, request_id: str) -> None:
        """Stop the request; its blocks are freed before the loop's next step."""
        self._commands.put(_Abort(request_id))

    # -- the loop thread --------------------------------------------------------------

    def _run(self) -> None:
        running = True
        while running:
            block = not self.engine.has_unfinished()
            running = self._apply_commands(block)
            if running and self.engine.has_unfinished():
                self._step()
            self._stats = self.engine.stats()
        self._fail_all(EngineDeadError("the engine was shut down"))

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued adds/aborts (waiting for one if idle); False on shutdown."""
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command is None:
                return False
            if isinstance(command, _Abort):
                self._deliver([self.engine.abort(command.request_id)])
                continue
            try:
                self.engine.add_request(
                    command.request_id, command.prompt_token_ids, command.params, command.cache_salt
                )
            except Exception as error:  # bad input, or a guide factory that failed
                self._deliver_error(command.request_id, error)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:
            log.exception("engine step failed; aborting the requests in flight")
            self._fail_all(EngineDeadError(f"the engine step failed: {error}"))
            return
        self._deliver(outputs)

    def _fail_all(self, error: BaseException) -> None:
        with self._streams_lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self.engine.abort(request_id)
            self._deliver_error(request_id, error)

    def _deliver(self, outputs: list[RequestOutput | None]) -> None:
        for output in outputs:
            if output is None:
                continue
            with self._streams_lock:
                stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, output)

    def _deliver_error(self, request_id: str, error: BaseException) -> None:
        with self._streams_lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)
