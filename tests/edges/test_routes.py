"""Every path of serve and gateway answers in OpenAI's shape, and the gateway proxies
/tokenize and /detokenize to the model's backend (with the backend's own key)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:  # the fixture's types; conftest is not a module to import at run time
    from conftest import Edges

pytestmark = pytest.mark.slow

PROXIED = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize"]


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_unknown_routes_and_wrong_methods_are_openai_shaped(edges: Edges, via: str) -> None:
    target = getattr(edges, via)
    with httpx.Client(base_url=target.url, headers=target.headers, timeout=30) as http:
        _error(http.get("/v2/nothing"), 404)
        _error(http.post("/health"), 405)
        for path in PROXIED:
            _error(http.get(path), 405)
        paths = http.get("/openapi.json").json()["paths"]
    for path in PROXIED:
        assert "requestBody" in paths[path]["post"], path
    assert {"/health", "/metrics", "/v1/models"} <= set(paths)


def test_gateway_proxies_tokenize_and_detokenize(edges: Edges) -> None:
    gateway, serve = edges.gateway, edges.serve
    chat = [{"role": "user", "content": "hi"}]
    direct = httpx.post(
        f"{serve.url}/tokenize", json={"messages": chat}, headers=serve.headers, timeout=30
    ).json()
    with httpx.Client(base_url=gateway.url, headers=gateway.headers, timeout=30) as http:
        proxied = http.post("/tokenize", json={"model": "smol", "messages": chat})
        assert proxied.status_code == 200, proxied.text
        assert proxied.json()["tokens"] == direct["tokens"]
        text = http.post("/detokenize", json={"model": "smol", "tokens": direct["tokens"]})
        assert text.status_code == 200 and "hi" in text.json()["prompt"]
        _error(http.post("/tokenize", json={"prompt": "hi"}), 400)  # which model's tokenizer?
        _error(http.post("/detokenize", json={"model": "smol", "tokens": [-1]}), 400)
    _error(httpx.post(f"{gateway.url}/tokenize", json={"model": "smol", "prompt": "x"}), 401)
