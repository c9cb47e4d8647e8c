"""The worker pools: jobs run off the event loop, a bound on those let in, a trim after each."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inhouse.api.errors import APIError
from inhouse.server.workers import WorkerPool


def test_jobs_run_on_the_pools_threads_and_past_the_bound_answer_503() -> None:
    release = threading.Event()
    done: list[str] = []
    pool = WorkerPool("prompt", threads=1, max_waiting=1, after=lambda: done.append("job"))

    def blocked() -> str:
        release.wait(10)
        return threading.current_thread().name

    async def run() -> None:
        first = asyncio.ensure_future(pool.run(blocked))
        second = asyncio.ensure_future(pool.run(blocked))
        await asyncio.sleep(0.1)
        assert pool.admitted == 2
        with pytest.raises(APIError) as refused:
            await pool.run(blocked)
        assert refused.value.status_code == 503
        release.set()
        names = await asyncio.gather(first, second)
        assert all(name.startswith("inhouse-prompt") for name in names)
        assert pool.admitted == 0

    try:
        asyncio.run(run())
    finally:
        pool.shutdown()
    assert done == ["job", "job"]
