"""One client's heavy request leaves serve to everyone else: a 2,000-input embeddings
request (running or abandoned), a huge /tokenize, a huge chat body. A real `inhouse serve`
with the bundled chat and embedding models, the default 8 MiB body cap."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from inhouse.http.prometheus import sample_totals
from serving import Served, start_serve

pytestmark = pytest.mark.slow

KEY = "isolation-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
BIG_EMBEDDING = {"model": EMBEDDING_MODEL, "input": ["hello world " * 200] * 2000}  # 4.8 MB
ONE_INPUT_S = 1.0  # the bound for a one-input embedding beside a big request
HEALTH_S = 1.0
CHATS = 5  # json_schema chats timed idle and busy: a 12-token chat is ~0.1 s, so one
# scheduler hiccup on a 2-core host moves it; medians of five, not three


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("isolation") / "serve.log"
    served = start_serve(log, KEY, kv_cache_memory="256MiB", embedding_model=None)
    try:
        yield served
    finally:
        served.stop()


def _client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def _timed(call: Callable[[], object]) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def _metrics(served: Served) -> dict[str, float]:
    return sample_totals(httpx.get(f"{served.url}/metrics", timeout=10).text)


def _one_embedding(client: openai.OpenAI) -> Callable[[], object]:
    quick = client.with_options(timeout=10 * ONE_INPUT_S)  # before: 178.8 s
    return lambda: quick.embeddings.create(model=EMBEDDING_MODEL, input="hello there")


def _json_schema_chat(client: openai.OpenAI, served: Served, name: str) -> Callable[[], object]:
    """A chat whose schema (new each time, so it is compiled) makes it run 12 tokens."""
    schema = {
        "type": "object",
        "properties": {name: {"type": "string", "minLength": 200}},
        "required": [name],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}

    def call() -> object:
        reply = client.chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=12,
            temperature=0,
            response_format=fmt,  # type: ignore[arg-type]
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 12
        return reply

    return call


class RawRequest:
    """A POST sent over a socket of its own, so the test can leave without reading."""

    def __init__(self, served: Served, path: str, body: dict) -> None:
        url = urlsplit(served.url)
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.sock = socket.create_connection((url.hostname, url.port), timeout=60)
        self.sock.sendall(head.encode() + payload)
        self.sock.settimeout(0)

    def answered(self) -> bool:
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            return False

    def leave(self) -> None:
        self.sock.close()


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.1)


def test_a_big_embeddings_request_running_or_abandoned_leaves_the_model_to_others(
    served: Served,
) -> None:
    client = _client(served)
    _timed(_one_embedding(client))
    _timed(_json_schema_chat(client, served, "warm"))
    idle = [_timed(_json_schema_chat(client, served, f"idle_{i}")) for i in range(CHATS)]
    big = RawRequest(served, "/v1/embeddings", BIG_EMBEDDING)
    try:
        time.sleep(3)  # parsed and running (the client left after 3 s)
        beside = [_timed(_one_embedding(client)) for _ in range(3)]
        busy = [_timed(_json_schema_chat(client, served, f"busy_{i}")) for i in range(CHATS)]
        assert not big.answered(), "the big request finished: nothing ran beside it"
        assert max(beside) < ONE_INPUT_S, beside
        assert statistics.median(busy) < 2 * statistics.median(idle), (
            f"json_schema chats {busy} s beside the big request, {idle} s idle"
        )
    finally:
        big.leave()
    # the abandoned request's inputs stop running: it leaves the queue, the count stands still
    _wait_for(lambda: _metrics(served)["inhouse:embedding_requests_unfinished"] == 0, 10, "abandon")
    before = _metrics(served)["inhouse:embedding_inputs_total"]
    time.sleep(1.0)
    assert _metrics(served)["inhouse:embedding_inputs_total"] == before
    assert before < len(BIG_EMBEDDING["input"])
    assert _timed(_one_embedding(client)) < ONE_INPUT_S


class Watch:
    """/health polled and one chat streamed, in threads, while the test does something."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.health: list[float] = []
        self.gaps: list[float] = []
        self.done = threading.Event()
        self.threads = [threading.Thread(target=f) for f in (self._poll, self._stream)]

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        _wait_for(lambda: len(self.gaps) > 3, 60, "the stream's first tokens")
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def _poll(self) -> None:
        with httpx.Client(base_url=self.served.url, timeout=60) as http:
            while not self.done.is_set():
                self.health.append(_timed(lambda: http.get("/health").raise_for_status()))
                time.sleep(0.05)

    def _stream(self) -> None:
        client = _client(self.served)
        while not self.done.is_set():
            stream = client.chat.completions.create(
                model=self.served.model,
                messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=100,
                stream=True,
            )
            last = None  # the wait for a new stream's first chunk is not a stall
            for _ in stream:
                now = time.monotonic()
                if last is not None:
                    self.gaps.append(now - last)
                last = now


def _words(size: int) -> str:
    return " ".join(f"w{i % 9973}x" for i in range(size // 7))[:size]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/tokenize", {"prompt": _words(2 * 2**20)}, 200),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": _words(2**21)}]}, 400),
        # under the length bound (81 bytes a token, 2,048 tokens): tokenized, then refused
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": _words(2**17)}]}, 400),
    ],
    ids=["tokenize-2MiB", "chat-2MiB", "chat-128KiB"],
)
def test_a_huge_prompt_leaves_health_and_running_streams_alone(
    served: Served, path: str, body: dict, status: int
) -> None:
    with Watch(served) as watch:
        start = len(watch.gaps)
        answer = httpx.post(f"{served.url}{path}", json=body, headers=AUTH, timeout=600)
        during = watch.gaps[start:]
        health = list(watch.health)
    assert answer.status_code == status, answer.text[:300]
    if status == 200:
        assert answer.json()["count"] > 2 * 10**5
    else:
        message = answer.json()["error"]["message"]
        assert "max_model_len" in message
        # past the length bound, refused untokenized; under it, counted by the tokenizer
        assert ("has at least" in message) == (len(body["messages"][0]["content"]) > 2**20)
    assert max(health) < HEALTH_S, f"/health took {max(health):.2f} s"
    assert during, "no token streamed while the prompt was processed"
    assert max(during) < HEALTH_S, f"a running stream stalled {max(during):.2f} s"
