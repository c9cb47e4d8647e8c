"""Stopping a CPU step of worse work when a request of a better priority arrives.

Under ``--scheduling-policy priority`` or ``fair`` a request that arrives while a step runs
waits for that step, and a CPU step of sixteen long-context decodes or a prompt chunk takes
tens of milliseconds: that wait is most of an interactive request's time to first token
under batch load. So the step carries a stop flag. When a request arrives whose priority
is strictly better than every sequence the step in flight runs, the flag is set; the
model checks it before each layer and the step ends there (`StepAbandoned`), computing
nothing for anyone. The engine then applies the new request and schedules again: the
abandoned work is redone later with the same bits (the K/V it wrote so far are
overwritten by the same values), at the cost of the layers it ran, counted in
``EngineStats.abandoned_steps`` and ``abandoned_tokens``.

The flag is written by the thread that queues requests and read by the engine thread;
``arrived`` and ``begin`` hold a lock, so a request queued just after the engine took its
commands still stops the next step of worse work (before its first layer).
"""

from __future__ import annotations

import threading

import torch

NOTHING_PENDING = 1 << 62  # no request queued since the engine last took its commands


class StepAbandoned(Exception):
    """The step was stopped before a layer: a better request is waiting (see the module)."""


class StepInterrupt:
    """The stop flag of the step in flight and the best priority queued since it began."""

    def __init__(self) -> None:
        self.flag = torch.zeros(1, dtype=torch.int32)
        self._view = self.flag.numpy()
        self._lock = threading.Lock()
        self._step_best: int | None = None  # the best priority the step runs; None: no step
        self._pending = NOTHING_PENDING

    def arrived(self, priority: int) -> None:
        """A request of this priority was queued (called after it is on the engine's queue)."""
        with self._lock:
            self._pending = min(self._pending, priority)
            if self._step_best is not None and priority < self._step_best:
                self._view[0] = 1

    def taking_commands(self) -> None:
        """The engine is about to take its queued commands: what was queued is seen."""
        with self._lock:
            self._pending = NOTHING_PENDING

    def begin(self, best_priority: int) -> None:
        """A step whose best priority is ``best_priority`` starts; stopped at once when a
        better request was queued after the engine last took its commands."""
        with self._lock:
            self._step_best = best_priority
            self._view[0] = int(self._pending < best_priority)

    def end(self) -> None:
        """The step ended (run through or abandoned)."""
        with self._lock:
            self._step_best = None
            self._view[0] = 0

    @property
    def stopped(self) -> bool:
        """Whether the step in flight was asked to stop."""
        return bool(self._view[0])
