"""Every client mistake gets its status and OpenAI's error body, and the server lives on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

if TYPE_CHECKING:
    from conftest import RunningServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
HI = [{"role": "user", "content": "hi"}]


def _assert_error(response: httpx.Response, status: int, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    message = body["error"]["message"]
    assert message and "pydantic" not in message.lower() and "errors.pydantic" not in message
    if param is not None:
        assert body["error"]["param"] == param
    return message


def _chat(server: RunningServer, **body) -> httpx.Response:
    return server.http().post("/v1/chat/completions", json={"model": MODEL, **body})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HI, "temperature": 3}, "temperature"),
        ({"messages": HI, "top_p": 0}, "top_p"),
        ({"messages": HI, "n": 0}, "n"),
        ({"messages": HI, "max_tokens": -1}, "max_tokens"),
        ({"messages": HI, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": HI, "response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": HI, "tool_choice": "required"}, None),
        ({"messages": HI, "priority": 1001}, "priority"),
        ({"messages": HI, "priority": -1001}, "priority"),
        ({"messages": HI, "priority": "high"}, "priority"),
        ({"messages": HI, "priority": 1.5}, "priority"),
    ],
)
def test_bad_parameters_are_400_with_the_param_named(
    server: RunningServer, body: dict, param: str | None
) -> None:
    _assert_error(_chat(server, **body), 400, param)


def test_malformed_json_is_400(server: RunningServer) -> None:
    response = server.http().post(
        "/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"Content-Type": "application/json"},
    )
    assert "JSON" in _assert_error(response, 400)


def test_prompt_too_long_says_the_limit_and_the_count(server: RunningServer) -> None:
    long = [{"role": "user", "content": "word " * 3000}]
    message = _assert_error(_chat(server, messages=long, max_tokens=5), 400, "prompt")
    assert "1024" in message
    count = server.http().post("/tokenize", json={"messages": long}).json()["count"]
    assert str(count) in message


def test_max_tokens_past_the_context_is_400(server: RunningServer) -> None:
    _assert_error(_chat(server, messages=HI, max_tokens=5000), 400, "max_tokens")


def test_image_content_is_refused_for_a_text_only_model(server: RunningServer) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    message = _assert_error(_chat(server, messages=messages), 400)
    assert "image" in message


def test_unsupported_schema_is_400(server: RunningServer) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    _assert_error(_chat(server, messages=HI, response_format=fmt), 400, "response_format")


def test_unknown_model_and_route_are_404(server: RunningServer) -> None:
    response = server.http().post("/v1/chat/completions", json={"model": "gpt-9", "messages": HI})
    _assert_error(response, 404, "model")
    _assert_error(server.http().get("/v1/nothing-here"), 404)


def test_wrong_or_missing_key_is_401(server: RunningServer) -> None:
    for headers in ({"Authorization": "Bearer wrong"}, {}):
        response = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": MODEL, "messages": HI},
            headers=headers,
        )
        _assert_error(response, 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0).models.list()


def test_body_over_the_limit_is_413(server: RunningServer) -> None:
    big = [{"role": "user", "content": "x" * 100_000}]
    _assert_error(_chat(server, messages=big), 413)

    def chunked():
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"}]}'

    response = server.http().post(
        "/v1/chat/completions", content=chunked(), headers={"Content-Type": "application/json"}
    )
    _assert_error(response, 413)


def test_bad_embedding_and_tokenize_input(server: RunningServer) -> None:
    http = server.http()
    _assert_error(http.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": []}), 400)
    _assert_error(http.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404)
    _assert_error(http.post("/detokenize", json={"tokens": [10**9]}), 400)
    _assert_error(http.post("/tokenize", json={}), 400)


def test_the_server_still_answers_after_the_errors(server: RunningServer) -> None:
    reply = server.client().chat.completions.create(model=MODEL, messages=HI, max_tokens=3)
    assert reply.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=HI, temperature=-1)
    assert caught.value.status_code == 400


def test_a_bad_prompt_in_a_batch_fails_the_batch_and_leaves_nothing_running(
    server: RunningServer,
) -> None:
    body = {"model": MODEL, "prompt": [[1, 2, 3], [10**9]], "max_tokens": 200, "ignore_eos": True}
    for stream in (False, True):
        response = server.http().post("/v1/completions", json={**body, "stream": stream})
        _assert_error(response, 400, "prompt")
    deadline = time.monotonic() + 3  # aborted at the next step, not after 200 tokens
    while (line := _running_line(server)).split()[-1] != "0.0":
        assert time.monotonic() < deadline, line
        time.sleep(0.1)


def _running_line(server: RunningServer) -> str:
    metrics = httpx.get(f"{server.base_url}/metrics").text.splitlines()
    return next(line for line in metrics if line.startswith("inhouse:num_requests_running{"))


def test_a_client_leaving_a_streamed_batch_stops_it_without_an_error(
    server: RunningServer,
) -> None:
    """The pumps of a streamed batch were still iterating their streams when the
    disconnect closed them: "aclose(): asynchronous generator is already running", logged
    as an error while streaming."""
    body = {"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 300, "ignore_eos": True}
    log = server.served.process.log
    logged = len(log.read_text())
    with server.http().stream("POST", "/v1/completions", json={**body, "stream": True}) as sse:
        lines = sse.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
    deadline = time.monotonic() + 5  # aborted at the next steps, not after 300 tokens
    while (line := _running_line(server)).split()[-1] != "0.0":
        assert time.monotonic() < deadline, line
        time.sleep(0.1)
    time.sleep(0.5)  # past serve's disconnect poll
    assert "error while streaming" not in log.read_text()[logged:]
