"""``/v1/embeddings`` with the bundled all-MiniLM-L6-v2."""

from __future__ import annotations

import base64
import math
from typing import TYPE_CHECKING

import numpy as np
import pytest
from fastapi.testclient import TestClient

from inhouse.engine.config import EngineConfig
from inhouse.server.app import build_app
from inhouse.server.context import ServerConfig, ServerContext
from inhouse.server.loading import ContextLoader

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import RunningServer

pytestmark = pytest.mark.slow


def test_embeddings_are_unit_384_vectors_and_paraphrases_are_closer(server: RunningServer) -> None:
    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is about space pirates.",
    ]
    reply = server.client().embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    vectors = [d.embedding for d in sorted(reply.data, key=lambda d: d.index)]
    assert [len(v) for v in vectors] == [384, 384, 384]
    for v in vectors:
        assert math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4)

    def cos(a: list[float], b: list[float]) -> float:
        return math.fsum(x * y for x, y in zip(a, b, strict=True))

    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2]) + 0.3
    assert reply.usage.prompt_tokens > 0


def test_base64_and_single_input(server: RunningServer) -> None:
    client = server.client()
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input="hello").data[0].embedding
    # the openai client asks for base64 by default when numpy is around and decodes it itself;
    # ask explicitly so the base64 path is what we check
    raw = server.http().post(
        "/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": "hello", "encoding_format": "base64"},
    )
    decoded = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats, atol=1e-6)


def test_an_embedding_model_that_fails_to_load_answers_503_and_chat_still_serves(
    tmp_path: Path,
) -> None:
    """The embedding model loads after the chat model (the server is ready first): a
    broken one fails its own route in OpenAI's shape, not the server."""
    broken = tmp_path / "no-such-model"
    broken.mkdir()
    ctx = ServerContext.create(ServerConfig(embedding_model=broken), "m")
    ContextLoader(EngineConfig(max_model_len=256, kv_cache_memory=16 * 2**20))(ctx)
    with TestClient(build_app(ctx)) as client:
        assert client.get("/health").status_code == 200
        models = [card["id"] for card in client.get("/v1/models").json()["data"]]
        assert models == ["m", "no-such-model"]
        refused = client.post("/v1/embeddings", json={"input": "hello"})
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["type"] == "service_unavailable"
        assert error["message"].startswith("The embedding model failed to load")
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        answer = client.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
