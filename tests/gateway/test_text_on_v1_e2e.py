"""Text on `/v1` bounded before the database (issue 43): a NUL is legal in a JSON string, so a
prompt, an answer, a `user`, a metadata value or a model name may hold one; PostgreSQL takes
no NUL in text. Each request is answered as without it (the backend gets the text as sent),
and its audit row is written whole, with the NUL stored as its JSON escape: not dropped, and
not a model name cut back to another model's. A lone surrogate is no Unicode: 400. A real
gateway before the canned upstream (`gateway_under_test`), on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from canned_upstream import Canned
from gateway_under_test import Gateway, key_rows, start_gateway

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]
NUL = "\\u0000"  # the stored escape

# name: (path, body, status, audit column: its stored value)
CASES: dict[str, tuple[str, dict[str, Any], int, dict[str, Any]]] = {
    "chat-prompt": ("/v1/chat/completions",
                    {"model": "m", "messages": [{"role": "user", "content": "a\x00b"}]}, 200,
                    {"prompt_text": json.dumps([{"role": "user", "content": "a\x00b"}])}),
    "chat-stream": ("/v1/chat/completions",
                    {"model": "m", "messages": [{"role": "user", "content": "a\x00b"}],
                     "stream": True}, 200, {"stream": True}),
    "answer": ("/v1/chat/completions",
               {"model": "m", "messages": [{"role": "user", "content": "echo: x\x00y"}]}, 200,
               {"completion_text": f"x{NUL}y"}),
    "completions-prompt": ("/v1/completions", {"model": "m", "prompt": "a\x00b", "max_tokens": 2},
                           200, {"prompt_text": f"a{NUL}b"}),
    "message-name": ("/v1/chat/completions",
                     {"model": "m", "messages": [{"role": "user", "content": "hi",
                                                  "name": "n\x00"}]}, 200, {}),
    "user": ("/v1/chat/completions", {"model": "m", "messages": HI, "user": "u\x00x"}, 200, {}),
    "metadata": ("/v1/chat/completions",
                 {"model": "m", "messages": HI, "metadata": {"k\x00": "v\x00"}}, 200, {}),
    "tokenize": ("/tokenize", {"model": "m", "prompt": "a\x00b"}, 200, {"prompt_text": f"a{NUL}b"}),
    "model": ("/v1/chat/completions", {"model": "m\x00", "messages": HI}, 404,
              {"model": f"m{NUL}"}),
    "user-surrogate": ("/v1/chat/completions", {"model": "m", "messages": HI, "user": "\udfff"},
                       400, {}),
}  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, canned: Canned
) -> Iterator[Gateway]:
    database = request.getfixturevalue("postgres") if request.param == "postgres" else None
    base = tmp_path_factory.mktemp(f"gateway-{request.param}")
    running = start_gateway(base, canned, database=database)
    try:
        yield running
    finally:
        running.process.stop()


@pytest.mark.parametrize("case", CASES)
def test_text_the_database_refuses_is_answered_and_audited_whole(
    gateway: Gateway, case: str
) -> None:
    path, body, status, stored = CASES[case]
    secret = gateway.store.create(case, log_content=True)[1]
    raw = json.dumps(body).encode()  # "\u0000" and "\udfff" as a client's JSON holds them
    answer = httpx.post(
        f"{gateway.url}{path}", content=raw, timeout=30,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )  # fmt: skip
    assert answer.status_code == status, answer.text
    if status != 200:
        assert set(answer.json()["error"]) >= {"message", "type", "param", "code"}
    if case == "answer":
        assert answer.json()["choices"][0]["message"]["content"] == "x\x00y"
    (row,) = key_rows(gateway, case, 1)
    assert row["status"] == status
    assert {column: row[column] for column in stored} == stored
    log = gateway.process.log.read_text()
    assert "could not be written" not in log and "Traceback" not in log
