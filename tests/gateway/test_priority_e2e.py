"""A key's priority class on the wire: a real gateway before the canned upstream (a real HTTP
server that keeps every body it receives, `canned_upstream`) and the official `openai`
client. The class a request runs at is its body's `priority` clamped to its key's class,
sent upstream as vLLM's integer and written in the audit row; a `priority` that is neither
a bounded integer nor a class name is a 400, never a 500."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from canned_upstream import Canned
from gateway_under_test import Gateway, key_rows, start_gateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inhouse.gateway.priority import PRIORITY_BOUND

pytestmark = pytest.mark.slow

_asked = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Gateway]:
    running = start_gateway(tmp_path_factory.mktemp("gateway"), canned)
    running.secrets = {  # type: ignore[attr-defined]
        cls: running.key(f"key-{cls}", priority=cls) for cls in ("interactive", "default", "batch")
    }
    try:
        yield running
    finally:
        running.process.stop()


def _sent(canned: Canned, text: str) -> dict[str, Any]:
    """The body the upstream received for the chat that said `text` (health probes and
    other tests' requests arrive there too)."""
    bodies = [b for _, b in canned.received if b.get("messages", [{}])[-1].get("content") == text]
    assert len(bodies) == 1, f"{len(bodies)} upstream requests said {text!r}"
    return bodies[0]


def _ask(gateway: Gateway, cls: str, priority: Any, stream: bool = False) -> tuple[str, Any]:
    text = f"echo: case {next(_asked)}"
    extra = {} if priority is None else {"priority": priority}
    client = gateway.client(gateway.secrets[cls])  # type: ignore[attr-defined]
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], stream=stream, extra_body=extra
    )
    if stream:
        list(answer)
    return text, answer


CASES = [  # key class, body priority, the class it runs at (never sooner than its key's)
    ("interactive", None, "interactive"),
    ("interactive", 1, "batch"),
    ("interactive", "default", "default"),
    ("interactive", -7, "interactive"),
    ("default", None, "default"),
    ("default", -5, "default"),
    ("default", 7, "batch"),
    ("batch", None, "batch"),
    ("batch", -1, "batch"),
    ("batch", "interactive", "batch"),
]
VLLM = {"interactive": -1, "default": 0, "batch": 1}


def test_the_class_is_clamped_to_the_keys_sent_upstream_and_audited(
    gateway: Gateway, canned: Canned
) -> None:
    ran: dict[str, list[str]] = {}
    for cls, asked, expected in CASES:
        text, _ = _ask(gateway, cls, asked, stream=asked == 1)
        assert _sent(canned, text)["priority"] == VLLM[expected], (cls, asked)
        ran.setdefault(cls, []).append(expected)
    for cls, expected in ran.items():
        rows = key_rows(gateway, f"key-{cls}", len(expected))
        assert [r["priority"] for r in rows[-len(expected) :]] == expected


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    priority=st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
        st.text(max_size=12),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )
)
def test_any_priority_value_is_answered_200_or_an_openai_400(
    gateway: Gateway, priority: Any
) -> None:
    secret = gateway.secrets["default"]  # type: ignore[attr-defined]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "priority": priority}
    reply = gateway.post("/v1/chat/completions", secret, body)
    valid = (
        isinstance(priority, int) and not isinstance(priority, bool)
        and abs(priority) <= PRIORITY_BOUND
    ) or priority in ("interactive", "default", "batch")  # fmt: skip
    if valid:
        assert reply.status_code == 200, reply.text
        return
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "priority" and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
