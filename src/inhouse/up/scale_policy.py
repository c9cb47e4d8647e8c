"""When to add or drain a replica: the seeds' signals, read each tick, and the hysteresis
that turns them into at most one scale event per cooldown.

The signals, per model, over its replicas not being drained (what the gateway's `/metrics`
exports, read in-process):
- demand: requests in flight at the replicas plus those waiting in the gateway's queue,
  per seat (a seat: one of a replica's `max_num_seqs`, else one of its gateway slots);
- waiting: requests the engines report not yet scheduled (their own `/metrics`, scraped
  each health interval), per replica;
- KV-cache use: the fullest replica's share;
- p99 time to first token through the gateway over the last up-window, against the SLO
  (`--slo ttft=…`; no TTFT signal without one).

Up when one of them stays high at every tick for `up_after_s`: demand > `up_above` (1.0:
more requests than seats), waiting > `WAITING_ABOVE` per replica, KV > `kv_above`, p99
TTFT > SLO. Down when all of them stay low for `down_after_s` (longer): the demand would
fill at most `down_below` of the seats of the replicas left, nothing waits, KV ≤
`kv_below`, p99 TTFT ≤ half the SLO. After each event the windows start again and nothing
happens for `cooldown_s`. With `down_below` ≤ `up_above` a drain never makes a start: the
demand per seat it leaves is at most `down_below`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from inhouse.gateway.backends import Backend

WAITING_ABOVE = 1.0  # requests an engine holds unscheduled, per replica: it is full
TTFT_QUANTILE = 0.99


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """The autoscaler's windows and marks (defaults for a real deployment)."""

    up_after_s: float = 30.0
    down_after_s: float = 300.0
    cooldown_s: float = 60.0
    up_above: float = 1.0  # demand per seat
    down_below: float = 0.5  # demand per seat of the replicas that would be left
    kv_above: float = 0.9
    kv_below: float = 0.5
    ttft_slo_s: float | None = None
    tick_s: float = 1.0

    def check(self) -> None:
        """Raise ValueError on settings that would flap or never act."""
        if min(self.up_after_s, self.down_after_s, self.cooldown_s) < 0:
            raise ValueError("the scale windows and cooldown must be >= 0")
        if not 0 < self.down_below <= self.up_above:
            raise ValueError("need 0 < --scale-down-below <= --scale-up-above (no flapping)")
        if not 0 <= self.kv_below < self.kv_above <= 1:
            raise ValueError("need 0 <= kv_below < kv_above <= 1")


@dataclass(frozen=True, slots=True)
class Signals:
    """One tick's reading of a model's load."""

    replicas: int
    demand: float  # requests in flight or queued at the gateway
    seats: float  # per replica
    waiting: float  # engines' unscheduled requests, all replicas
    kv: float  # the fullest replica's KV-cache share
    ttft_p99_s: float | None  # None: no request got its first token in the window

    def per_seat(self, replicas: int) -> float:
        """Demand per seat were `replicas` serving it (infinite for none)."""
        return self.demand / (replicas * self.seats) if replicas > 0 else float("inf")


def read_signals(backends: Iterable[Backend], queued: int, ttft_p99_s: float | None) -> Signals:
    """The signals of one model's replicas (those draining left out) and gateway queue."""
    serving = [b for b in backends if not b.draining]
    seats = [b.upstream.max_num_seqs or b.upstream.max_in_flight for b in serving]
    return Signals(
        replicas=len(serving),
        demand=sum(b.in_flight for b in serving) + queued,
        seats=sum(seats) / len(seats) if seats else 1.0,
        waiting=sum(b.waiting for b in serving),
        kv=max((b.kv_usage for b in serving), default=0.0),
        ttft_p99_s=ttft_p99_s,
    )


def high_reason(s: Signals, t: ScaleSettings) -> str | None:
    """The first signal above its up mark (its name and figures), None when none is."""
    if s.per_seat(s.replicas) > t.up_above:
        return f"queue: {s.demand:g} requests on {s.replicas} × {s.seats:g} seats"
    if s.replicas and s.waiting / s.replicas > WAITING_ABOVE:
        return f"waiting: {s.waiting:g} unscheduled at the engines"
    if s.kv > t.kv_above:
        return f"kv_cache: {s.kv:.0%} in use"
    if t.ttft_slo_s is not None and s.ttft_p99_s is not None and s.ttft_p99_s > t.ttft_slo_s:
        return f"ttft: p99 {s.ttft_p99_s:.2f} s > SLO {t.ttft_slo_s:g} s"
    return None


def all_low(s: Signals, t: ScaleSettings) -> bool:
    """Whether the load would fit one replica fewer below every down mark."""
    ttft_low = t.ttft_slo_s is None or s.ttft_p99_s is None or s.ttft_p99_s <= t.ttft_slo_s / 2
    return (
        s.per_seat(s.replicas - 1) <= t.down_below
        and s.waiting == 0
        and s.kv <= t.kv_below
        and ttft_low
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """One scale event: its direction, its reason (a metric label) and the figures."""

    direction: str  # "up" or "down"
    reason: str  # queue, waiting, kv_cache, ttft (up); low_load (down)
    detail: str


class Hysteresis:
    """Turns each tick's signals into a decision once one side has held for its window,
    within [low, high] replicas and outside the cooldown after the last event."""

    def __init__(self, settings: ScaleSettings, low: int, high: int) -> None:
        self.settings, self.low, self.high = settings, low, high
        self._high_since: float | None = None
        self._low_since: float | None = None
        self._quiet_until = 0.0

    def step(self, now: float, signals: Signals) -> Decision | None:
        t = self.settings
        reason = high_reason(signals, t)
        low = reason is None and all_low(signals, t)
        self._high_since = _since(self._high_since, now, reason is not None)
        self._low_since = _since(self._low_since, now, low)
        if now < self._quiet_until:
            return None
        held_high = self._high_since is not None and now - self._high_since >= t.up_after_s
        if reason is not None and held_high and signals.replicas < self.high:
            return Decision("up", reason.split(":")[0], reason)
        held_low = self._low_since is not None and now - self._low_since >= t.down_after_s
        if held_low and signals.replicas > self.low:
            detail = f"low_load: {signals.demand:g} requests fit {signals.replicas - 1} replica(s)"
            return Decision("down", "low_load", detail)
        return None

    def settle(self, now: float) -> None:
        """An event ended at `now`: start the cooldown, and both windows afresh."""
        self._quiet_until = now + self.settings.cooldown_s
        self._high_since = self._low_since = None


def _since(since: float | None, now: float, holds: bool) -> float | None:
    """When a condition that `holds` now began to (None when it does not hold)."""
    if not holds:
        return None
    return now if since is None else since


class TtftWindow:
    """The p99 of the TTFTs observed in a trailing window, from snapshots of the gateway's
    cumulative histogram (upper bound, count) taken each tick."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._snapshots: deque[tuple[float, list[tuple[float, float]]]] = deque()

    def add(self, now: float, buckets: list[tuple[float, float]]) -> float | None:
        """Take a snapshot; the window's p99 (None when nothing was observed in it)."""
        self._snapshots.append((now, buckets))
        while len(self._snapshots) > 1 and self._snapshots[1][0] <= now - self.window_s:
            self._snapshots.popleft()
        old = dict(self._snapshots[0][1])
        return quantile([(le, n - old.get(le, 0.0)) for le, n in buckets], TTFT_QUANTILE)


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """`histogram_quantile` over cumulative buckets: linear within the bucket that holds the
    rank; the last finite bound when it falls in +Inf."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank = q * total
    below_le, below_n = 0.0, 0.0
    for le, n in ordered:
        if n >= rank:
            if le == float("inf"):
                return below_le
            return below_le + (le - below_le) * (rank - below_n) / max(n - below_n, 1e-12)
        below_le, below_n = le, n
    return below_le
