"""The app before (or without) a model: 503s, error bodies, limits — no model needed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from inhouse.server.app import build_app
from inhouse.server.context import ServerConfig, ServerContext
from inhouse.server.model_state import Phase

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.fixture
def loading_client() -> TestClient:
    ctx = ServerContext.create(ServerConfig(api_key="k", max_body_bytes=1000), "m")
    return TestClient(build_app(ctx), headers={"Authorization": "Bearer k"})


def test_model_routes_answer_503_until_loaded(loading_client: TestClient) -> None:
    health = loading_client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "loading"
    for method, path, body in [
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/completions", {"model": "m", "prompt": "x"}),
        ("GET", "/v1/models", None),
        ("POST", "/tokenize", {"prompt": "x"}),
    ]:
        response = loading_client.request(method, path, json=body)
        assert response.status_code == 503, path
        assert error_of(response)["type"] == "service_unavailable"
    assert loading_client.get("/metrics").status_code == 200


def test_client_errors_come_before_the_503(loading_client: TestClient) -> None:
    response = loading_client.post(
        "/v1/chat/completions", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert "JSON" in error_of(response)["message"]
    missing = loading_client.post("/v1/chat/completions", json={"model": "m"})
    assert missing.status_code == 400 and error_of(missing)["param"] == "messages"
    assert (
        loading_client.post("/v1/chat/completions", json={**CHAT, "model": "x"}).status_code == 404
    )
    big = loading_client.post("/v1/chat/completions", json={**CHAT, "user": "u" * 2000})
    assert big.status_code == 413 and error_of(big)["code"] == "request_too_large"
    unknown = loading_client.get("/v2/whatever")
    assert unknown.status_code == 404
    wrong_method = loading_client.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert error_of(wrong_method)["message"]


@pytest.mark.parametrize("raw", [b"null", b"0", b"1.5", b"true", b'"text"', b"[]", b"[{}]"])
def test_a_body_that_is_not_an_object_is_400_on_every_post_route(
    loading_client: TestClient, raw: bytes
) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize"):
        response = loading_client.post(
            path, content=raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, (path, response.text)
        assert error_of(response)["message"] == "The request body must be a JSON object."
    detokenize = loading_client.post("/detokenize", content=raw)
    assert detokenize.status_code == 400, detokenize.text


def test_missing_key_is_401_but_health_and_metrics_are_open() -> None:
    ctx = ServerContext.create(ServerConfig(api_key="k"), "m")
    client = TestClient(build_app(ctx))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 401
    assert error_of(response)["code"] == "invalid_api_key"
    assert client.get("/health").status_code == 503
    assert client.get("/metrics").status_code == 200


def test_a_failed_load_is_reported_by_health() -> None:
    def fail(_: ServerContext) -> None:
        raise RuntimeError("no such model file")

    ctx = ServerContext.create(ServerConfig(), "m")
    with TestClient(build_app(ctx, fail)) as client:
        assert ctx.model.wait(10) is Phase.FAILED
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "no such model file" in health.json()["detail"]
        chat = client.post("/v1/chat/completions", json=CHAT)
        assert chat.status_code == 503 and "no such model file" in error_of(chat)["message"]
