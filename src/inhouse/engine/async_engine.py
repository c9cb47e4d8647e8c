"""AsyncEngine: the ``EngineCore`` step loop in its own thread, output processing on asyncio.

The engine thread only schedules, runs the model and samples; it hands each request's
token-id news to that request's queue. ``generate`` (on the caller's event loop) turns
them into text with the ``OutputProcessor``: detokenizing, stop strings and logprob
text never hold up the next forward pass. A stop string found there goes back to the
loop as a ``Finish``. ``generate`` validates at once (EngineInputError before anything
is scheduled); ``abort`` (also when the consumer stops iterating or is cancelled) is
applied before the loop's next step, which frees the request's blocks. Under the
priority and fair policies a request of a better priority than the step in flight stops
that step before its next layer (``step_interrupt``), so it is scheduled at once.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from inhouse.engine.config import EngineConfig
from inhouse.engine.core import EngineCore
from inhouse.engine.errors import EngineInputError, RequestFailedError
from inhouse.engine.info import EngineInfo
from inhouse.engine.lora.slots import LoadedAdapter
from inhouse.engine.models.loader import LoadedModel
from inhouse.engine.output_processor import OutputProcessor
from inhouse.engine.outputs import CoreOutput, Finish, RequestOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.stats import EngineStats

log = logging.getLogger(__name__)

# The engine thread needs the GIL back after every C++ call; while the event loop runs
# Python (SSE chunks, JSON, new prompts) it would wait up to the default 5 ms for it, and
# a decode step's many short calls would each pay that wait: a shorter interval lets it
# back in soon after each one.
GIL_SWITCH_INTERVAL_S = 0.0005


class EngineDeadError(RuntimeError):
    """The engine loop failed (or was shut down) while running this request."""


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[CoreOutput | BaseException]


@dataclass(slots=True)
class _Abort:
    request_id: str


@dataclass(slots=True)
class _Call:
    """Work that must run on the engine thread between steps (adapter loads and unloads)."""

    fn: Callable[[], Any]
    done: Future


class AsyncEngine:
    """Serves many concurrent ``generate`` calls from one background step loop."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.core = EngineCore(config, loaded)
        self.processor = OutputProcessor(self.info.tokenizer)
        self._commands: queue.SimpleQueue[EngineRequest | _Abort | _Call | Finish | None] = (
            queue.SimpleQueue()
        )
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._stats = self.core.stats()
        self._thread: threading.Thread | None = None

    @property
    def info(self) -> EngineInfo:
        """What the engine serves: model, dtype, tokenizer, max_model_len, KV budget."""
        return self.core.info

    def stats(self) -> EngineStats:
        """The snapshot taken after the loop's latest step."""
        return self._stats

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the step loop; also shortens the interpreter's GIL switch interval (see
        ``GIL_SWITCH_INTERVAL_S``)."""
        if self._thread is not None:
            return
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
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

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas as they come; the last one has ``finished`` set.

        Raises RequestFailedError if the request fails inside the engine.
        """
        rid = request.request_id
        stream = self._open(request)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                output, finishes = self.processor.process(item)
                for finish in finishes:
                    self._commands.put(finish)
                if output is None:
                    continue
                finished = output.finished
                if output.error is not None:
                    raise RequestFailedError(output.error)
                yield output
        finally:
            with self._streams_lock:
                self._streams.pop(rid, None)
            self.processor.drop(rid)
            if not finished:
                self.abort(rid)

    def _open(self, request: EngineRequest) -> _Stream:
        if self._thread is None:
            raise RuntimeError("AsyncEngine.start() was not called")
        self.core.validate(request)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._streams_lock:
            if request.request_id in self._streams:
                raise EngineInputError(f"request id {request.request_id!r} is already running")
            self._streams[request.request_id] = stream
        self.processor.add(request)
        self._commands.put(request)
        if self.core.interrupt is not None:
            self.core.interrupt.arrived(request.priority)
        return stream

    def abort(self, request_id: str) -> None:
        """Stop the request; its blocks are freed before the loop's next step."""
        self._commands.put(_Abort(request_id))

    # -- LoRA adapters ----------------------------------------------------------------

    def adapters(self) -> list[LoadedAdapter]:
        """The adapters requests may name now."""
        slots = self.core.adapters
        return [] if slots is None else list(slots.adapters.values())

    async def load_adapter(self, name: str, path: str) -> LoadedAdapter:
        """Read a PEFT adapter (off the loop) and put it in a free slot between two steps;
        AdapterError when it cannot be served or no slot is free."""
        weights = await asyncio.to_thread(self.core.read_adapter, path)
        return await self._between_steps(lambda: self.core.load_adapter(name, weights))

    async def unload_adapter(self, name: str) -> LoadedAdapter:
        """Stop taking requests for ``name`` between two steps (its running ones finish);
        KeyError if none is loaded under that name."""
        return await self._between_steps(lambda: self.core.unload_adapter(name))

    async def _between_steps(self, fn: Callable[[], Any]) -> Any:
        if self._thread is None:
            raise RuntimeError("AsyncEngine.start() was not called")
        done: Future = Future()
        self._commands.put(_Call(fn, done))
        return await asyncio.wrap_future(done)

    # -- the loop thread --------------------------------------------------------------

    def _run(self) -> None:
        running = True
        while running:
            block = not self.core.has_unfinished()
            running = self._apply_commands(block)
            if running and self.core.has_unfinished():
                self._step()
            self._stats = self.core.stats()
        self._fail_all(EngineDeadError("the engine was shut down"))

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued adds, aborts and finishes (waiting for one if idle); False on shutdown."""
        if self.core.interrupt is not None:
            self.core.interrupt.taking_commands()
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command is None:
                return False
            if isinstance(command, _Abort):
                self._deliver([self.core.abort(command.request_id)])
            elif isinstance(command, Finish):
                self.core.apply_finish(command)
            elif isinstance(command, _Call):
                try:
                    command.done.set_result(command.fn())
                except Exception as error:  # the caller's to report (a bad adapter, say)
                    command.done.set_exception(error)
            else:
                try:
                    self.core.enqueue(command)  # validated in _open
                except Exception as error:  # bad input, or a guide factory that failed
                    self._deliver_error(command.request_id, error)

    def _step(self) -> None:
        try:
            outputs = self.core.step()
        except Exception as error:
            log.exception("engine step failed; aborting the requests in flight")
            self._fail_all(EngineDeadError(f"the engine step failed: {error}"))
            return
        self._deliver(outputs)

    def _fail_all(self, error: BaseException) -> None:
        with self._streams_lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self.core.abort(request_id)
            self._deliver_error(request_id, error)

    def _deliver(self, outputs: list[CoreOutput | None]) -> None:
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
