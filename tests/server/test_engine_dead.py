"""When the engine really stops, the server says so: the request in flight and every later
one get 503 in OpenAI's shape, and /health turns 503 (not 500 forever)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from fastapi.testclient import TestClient

from inhouse.engine.config import EngineConfig
from inhouse.server.app import build_app
from inhouse.server.context import ServerConfig, ServerContext
from inhouse.server.loading import ContextLoader
from inhouse.server.model_state import Phase

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "ignore_eos": True}


def test_a_dead_engine_makes_the_server_unhealthy_and_503() -> None:
    ctx = ServerContext.create(ServerConfig(), "m")
    ContextLoader(EngineConfig(max_model_len=256, kv_cache_memory=16 * 2**20))(ctx)
    engine = ctx.model.require().engine
    client = TestClient(build_app(ctx))
    assert client.get("/health").status_code == 200
    answers = []
    in_flight = threading.Thread(
        target=lambda: answers.append(client.post("/v1/chat/completions", json=CHAT))
    )
    in_flight.start()
    for _ in range(1200):  # bounded (60 s): the request runs once the engine has stepped it
        if engine.stats().num_running:
            break
        if answers:  # it finished before the engine stopped: nothing was tested
            pytest.fail(f"the request ended first: {answers[0].status_code}")
        in_flight.join(0.05)
    asyncio.run(engine.shutdown())
    in_flight.join(60)
    later = client.post("/v1/chat/completions", json=CHAT)
    for response in (*answers, later):
        assert response.status_code == 503, response.text
        assert response.json()["error"]["type"] == "service_unavailable"
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "dead"
    assert ctx.model.phase is Phase.DEAD and "restart the server" in health.json()["detail"]


def test_a_dead_engine_ends_a_streamed_batch_with_an_error_event() -> None:
    """A streamed /v1/completions batch merges its prompts' streams; one that failed left
    the merge waiting for its end forever, and the client with it."""
    ctx = ServerContext.create(ServerConfig(), "m")
    ContextLoader(EngineConfig(max_model_len=256, kv_cache_memory=16 * 2**20))(ctx)
    engine = ctx.model.require().engine
    client = TestClient(build_app(ctx))
    body = {"prompt": ["a", "b"], "max_tokens": 200, "ignore_eos": True, "stream": True}
    lines: list[str] = []

    def read() -> None:
        with client.stream("POST", "/v1/completions", json=body) as sse:
            lines.extend(sse.iter_lines())

    in_flight = threading.Thread(target=read, daemon=True)
    in_flight.start()
    for _ in range(1200):  # bounded (60 s): the stream has begun (before, a 503 is right)
        if any(line.startswith("data: ") for line in lines):
            break
        in_flight.join(0.05)
    asyncio.run(engine.shutdown())
    in_flight.join(30)
    assert not in_flight.is_alive(), "the stream never ended"
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2], events[-2]
