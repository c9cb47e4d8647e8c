"""The chat model's state: its transitions, the 503 each phase answers with, and a thread
waiting for the outcome wakes when loading ends (no polling)."""

from __future__ import annotations

import threading
import time

import pytest

from inhouse.api.errors import APIError
from inhouse.server.model_state import STILL_LOADING, ModelState, Phase


def test_loading_answers_503_until_it_ends() -> None:
    state = ModelState()
    assert state.phase is Phase.LOADING and state.loaded is None and state.error is None
    with pytest.raises(APIError) as refused:
        state.require()
    assert refused.value.status_code == 503 and refused.value.message == STILL_LOADING
    assert state.wait(0.01) is Phase.LOADING
    assert state.engine_stats() is None


def test_a_failed_load_says_why_and_cannot_become_ready() -> None:
    state = ModelState()
    state.fail("Loading the model failed: no such file")
    assert state.phase is Phase.FAILED and state.wait() is Phase.FAILED
    with pytest.raises(APIError, match="no such file"):
        state.require()
    with pytest.raises(RuntimeError, match="from failed to ready"):
        state.ready(None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="from failed to failed"):
        state.fail("again")


def test_only_a_ready_engine_can_die() -> None:
    with pytest.raises(RuntimeError, match="from loading to dead"):
        ModelState().die("it stopped")


def test_a_waiting_thread_wakes_when_loading_ends() -> None:
    state = ModelState()
    seen: list[tuple[Phase, float]] = []
    waiter = threading.Thread(target=lambda: seen.append((state.wait(30), time.monotonic())))
    waiter.start()
    time.sleep(0.05)
    assert not seen
    failed_at = time.monotonic()
    state.fail("broken")
    waiter.join(5)
    assert seen and seen[0][0] is Phase.FAILED
    assert seen[0][1] >= failed_at
