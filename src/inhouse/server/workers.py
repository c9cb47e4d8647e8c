"""Thread pools that keep CPU work off the event loop, one per kind of work.

Tokenizing a 7 MiB prompt takes seconds, and so can rendering 10^5 chat messages or
compiling a JSON schema; on the event loop, that stalls ``/health`` and every running
stream. Each kind gets its own few threads, so a flood of one kind cannot take the
threads of another (asyncio's default executor is shared by everything), and a bound
on how many may wait: past it a request is refused with a 503 instead of queueing
without end. The tokenizer releases the GIL while it works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from inhouse.api.errors import service_unavailable

T = TypeVar("T")

PROMPT_THREADS = 2  # tokenizing and chat templates
GRAMMAR_THREADS = 2  # compiling JSON schemas and tool schemas
MAX_WAITING = 64  # per pool: beyond running and this many waiting, 503


class WorkerPool:
    """A few named threads for one kind of work, with a bound on the jobs let in."""

    def __init__(
        self,
        name: str,
        threads: int,
        max_waiting: int = MAX_WAITING,
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.threads = threads
        self.max_waiting = max_waiting
        self._after = after  # called once each job is done (HeapTrimmer.note)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=f"inhouse-{name}")
        self._admitted = 0  # read and written on the event loop only

    @property
    def admitted(self) -> int:
        """Jobs running or waiting now."""
        return self._admitted

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """``fn(*args, **kwargs)`` on one of the pool's threads; a 503 when too many are ahead.

        Cancelling the caller drops a job that has not started yet.
        """
        if self._admitted >= self.threads + self.max_waiting:
            raise service_unavailable(
                f"The server has {self._admitted} {self.name} jobs in hand; retry soon."
            )
        self._admitted += 1
        try:
            return await asyncio.wrap_future(self._executor.submit(self._job, fn, args, kwargs))
        finally:
            self._admitted -= 1

    def _job(self, fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            self._after()

    def shutdown(self) -> None:
        """Stop taking jobs; queued ones are dropped, running ones finish on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
