"""Load generator: closed loop at a fixed concurrency, or open-loop Poisson/gamma arrivals."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from inhouse.bench.requests import BenchRequest, RequestRecord

Sender = Callable[[BenchRequest, float], Awaitable[RequestRecord]]
OnDone = Callable[[RequestRecord], None]


@dataclass(slots=True, frozen=True)
class LoadShape:
    """How requests are issued and when issuing stops.

    Closed loop: `request_rate` None, `max_concurrency` workers each send the next request as
    soon as their last one ends. Open loop: arrivals at `request_rate` per second with gamma
    inter-arrival times (`burstiness` 1 = Poisson, < 1 burstier, > 1 steadier), optionally
    capped at `max_concurrency` in flight. Issuing stops after `num_prompts` requests or
    `duration` seconds, whichever comes first; in-flight requests are always awaited.
    """

    max_concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_prompts is None and self.duration is None:
            raise ValueError("a load needs num_prompts or duration to end")
        if self.request_rate is None and self.max_concurrency is None:
            raise ValueError("a closed loop needs max_concurrency")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError("request_rate must be positive")
        if self.burstiness <= 0:
            raise ValueError("burstiness must be positive")


@dataclass(slots=True)
class LoadResult:
    """Records in completion order and the wall time from the first send to the last answer."""

    records: list[RequestRecord]
    duration: float


class _Issuer:
    """Hands out the next request, cycling the dataset, until the count or the clock runs out."""

    def __init__(
        self,
        requests: Sequence[BenchRequest],
        shape: LoadShape,
        zero: float,
        stop: asyncio.Event | None = None,
    ) -> None:
        if not requests:
            raise ValueError("no requests to send")
        self._requests = requests
        self._limit = shape.num_prompts
        self._deadline = None if shape.duration is None else zero + shape.duration
        self._stop = stop
        self._issued = 0

    def next(self, at: float | None = None) -> BenchRequest | None:
        """The next request, or None when done; `at` is its planned send time (default now)."""
        if self._limit is not None and self._issued >= self._limit:
            return None
        if self._stop is not None and self._stop.is_set():
            return None
        when = time.perf_counter() if at is None else at
        if self._deadline is not None and when >= self._deadline:
            return None
        request = self._requests[self._issued % len(self._requests)]
        if request.index != self._issued:
            request = replace(request, index=self._issued)
        self._issued += 1
        return request

    @property
    def count_reached(self) -> bool:
        """True once `num_prompts` requests have been handed out."""
        return self._limit is not None and self._issued >= self._limit


def arrival_gaps(rate: float, burstiness: float, rng: random.Random) -> Callable[[], float]:
    """Inter-arrival times with mean 1/rate drawn from gamma(shape=burstiness)."""
    scale = 1.0 / (rate * burstiness)
    return lambda: rng.gammavariate(burstiness, scale)


async def generate_load(
    requests: Sequence[BenchRequest],
    send: Sender,
    shape: LoadShape,
    on_done: OnDone | None = None,
    stop: asyncio.Event | None = None,
) -> LoadResult:
    """Send `requests` (cycled as needed) in the given shape and collect every record;
    issuing also ends once `stop` is set (in-flight requests are still awaited)."""
    zero = time.perf_counter()
    issuer = _Issuer(requests, shape, zero, stop)
    records: list[RequestRecord] = []

    async def run_one(request: BenchRequest) -> None:
        record = await send(request, zero)
        records.append(record)
        if on_done is not None:
            on_done(record)

    if shape.request_rate is None:
        await _closed_loop(issuer, run_one, shape.max_concurrency or 1)
    else:
        await _open_loop(issuer, run_one, shape)
    return LoadResult(records=records, duration=time.perf_counter() - zero)


async def _closed_loop(
    issuer: _Issuer, run_one: Callable[[BenchRequest], Awaitable[None]], workers: int
) -> None:
    async def worker() -> None:
        while (request := issuer.next()) is not None:
            await run_one(request)

    async with asyncio.TaskGroup() as group:
        for _ in range(workers):
            group.create_task(worker())


async def _open_loop(
    issuer: _Issuer, run_one: Callable[[BenchRequest], Awaitable[None]], shape: LoadShape
) -> None:
    assert shape.request_rate is not None
    gap = arrival_gaps(shape.request_rate, shape.burstiness, random.Random(shape.seed))
    cap = asyncio.Semaphore(shape.max_concurrency) if shape.max_concurrency else None

    async def capped(request: BenchRequest) -> None:
        if cap is None:
            await run_one(request)
            return
        async with cap:
            await run_one(request)

    # Arrivals are planned on absolute times, so sleeps that overshoot do not accumulate.
    planned = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        while (request := issuer.next(planned)) is not None:
            group.create_task(capped(request))
            if issuer.count_reached:
                break
            planned += gap()
            await asyncio.sleep(max(0.0, planned - time.perf_counter()))
