"""What a hostile or careless client tried against the gateway (issue 24): batches that
escaped TPM and quota, /tokenize outside the key's concurrency, a lone surrogate in
`model`, 429s without headers, two Authorization headers, odd key names, a backend key kept
in an audit row. A real gateway before the canned upstream (`gateway_under_test`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from canned_upstream import SLOW_TOKENIZE_S, Canned
from gateway_under_test import Gateway, key_rows, start_gateway
from sqlalchemy import text, update

from inhouse.gateway.db import api_keys
from serving import audit_rows

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hello"}]
DAY_S = 86400.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Gateway]:
    running = start_gateway(tmp_path_factory.mktemp("gateway"), canned)
    try:
        yield running
    finally:
        running.process.stop()


# -- item 3: every prompt shape and `n` reserved per completion -------------------------


PROMPT_SHAPES = {
    "text": "one two three",
    "texts": ["one two", "three four", "five"],
    "token ids": [5, 6, 7],
    "token-id batch": [[5]] * 100,
}


@pytest.mark.parametrize("shape", PROMPT_SHAPES)
@pytest.mark.parametrize("n", [1, 2])
def test_every_prompt_shape_reserves_what_it_can_use(gateway: Gateway, shape: str, n: int) -> None:
    """The reservation covers the usage of every shape (the upstream uses every output cap,
    as `ignore_eos` does): a token-id batch was reserved as one prompt."""
    name = f"shape-{shape.replace(' ', '-')}-{n}"
    client = gateway.client(gateway.key(name, tpm=10**6))
    answer = client.completions.create(
        model="m", prompt=PROMPT_SHAPES[shape], max_tokens=40, n=n, extra_body={"ignore_eos": True}
    )
    assert answer.usage is not None
    (row,) = key_rows(gateway, name, 1)
    assert row["status"] == 200 and row["prompt_tokens"] + row["completion_tokens"] == (
        answer.usage.total_tokens
    )
    assert row["reserved_tokens"] >= answer.usage.total_tokens, row


def test_a_token_id_batch_cannot_pass_the_quota_or_tpm(gateway: Gateway) -> None:
    """Issue 24's case: 100 token-id prompts × 40 tokens on a 3,000-token quota, and on
    `--tpm 2000`: both refused, nothing charged."""
    body = {"model": "m", "prompt": [[5]] * 100, "max_tokens": 40, "ignore_eos": True}
    quota = gateway.key("batch-quota", quota_tokens=3000, quota_period_s=30 * DAY_S)
    refused = gateway.post("/v1/completions", quota, body)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert "this request reserves 4100" in refused.json()["error"]["message"]
    assert gateway.store.get("batch-quota").quota_used_at(time.time()) == 0
    tpm = gateway.post("/v1/completions", gateway.key("batch-tpm", tpm=2000), body)
    assert tpm.status_code == 429 and tpm.json()["error"]["code"] == "rate_limit_exceeded"
    assert "4100 tokens can never fit" in tpm.json()["error"]["message"]


@pytest.mark.parametrize("limits", [{}, {"tpm": 10**7}])
def test_each_prompt_of_a_batch_has_the_whole_context(
    gateway: Gateway, canned: Canned, limits: dict[str, int]
) -> None:
    """100 prompts of ~40 tokens: together past the 2,048-token context, each well within
    it. Refused as one long prompt before; now sent with the full default output cap."""
    prompts = ["word " * 30] * 100
    client = gateway.client(gateway.key(f"batch-context-{len(limits)}", **limits))
    answer = client.completions.create(model="m", prompt=prompts)
    assert len(answer.choices) == 100
    sent = [body for _, body in canned.received if body.get("prompt") == prompts][-1]
    assert sent["max_tokens"] == 1024  # the model's default_max_tokens, not shrunk
    with pytest.raises(openai.BadRequestError) as refused:  # one prompt too long alone
        client.completions.create(model="m", prompt=["word", "word " * 2000])
    assert refused.value.code == "unsupported_capability"


def test_chat_n_reserves_the_cap_per_choice(gateway: Gateway) -> None:
    client = gateway.client(gateway.key("chat-n", tpm=10**6))
    client.chat.completions.create(model="m", messages=HELLO, max_tokens=30, n=3)
    (row,) = key_rows(gateway, "chat-n", 1)
    assert row["reserved_tokens"] >= 3 * 30


# -- item 5: /tokenize holds a concurrency slot of the key ------------------------------


def test_tokenize_takes_a_concurrency_slot_while_it_runs(gateway: Gateway) -> None:
    secret = gateway.key("tok-slot", max_concurrent=1)
    body = {"model": "m", "prompt": "slow"}
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(gateway.post("/tokenize", secret, body)))
    worker.start()
    time.sleep(SLOW_TOKENIZE_S / 3)
    second = gateway.post("/tokenize", secret, {"model": "m", "prompt": "fast"})
    worker.join()
    assert first[0].status_code == 200 and first[0].json()["count"] == 1
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
    after = gateway.post("/tokenize", secret, {"model": "m", "prompt": "fast"})
    assert after.status_code == 200  # the slot came back


# -- item 7: a lone surrogate in `model` -----------------------------------------------


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/chat/completions", "messages"), ("/v1/embeddings", "input"), ("/tokenize", "prompt")],
)
def test_a_lone_surrogate_in_model_is_an_audited_404(
    gateway: Gateway, path: str, field: str
) -> None:
    name = "surrogate" + path.replace("/", "-")
    secret = gateway.key(name)
    raw = json.dumps({"model": "\ud800", field: HELLO if field == "messages" else "hi"})
    assert "\\ud800" in raw  # JSON's escape of a lone surrogate, as a client sends it
    answer = httpx.post(
        f"{gateway.url}{path}", content=raw.encode(), timeout=10,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )  # fmt: skip
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert "\ufffd" in error["message"]
    (row,) = key_rows(gateway, name, 1)
    assert row["status"] == 404
    assert gateway.scrape("/metrics").status_code == 200  # the name is no label


def test_an_unexpected_error_is_still_an_openai_500(gateway: Gateway) -> None:
    """A key row no code expects (a limit that is not a number, as a hand-edited database
    holds) fails inside admission: the answer is a logged 500 in OpenAI's shape."""
    secret = gateway.key("corrupt-row", rpm=5)
    with gateway.store._db.begin() as conn:
        conn.execute(text("UPDATE api_keys SET rpm = 'five' WHERE name = 'corrupt-row'"))
    answer = gateway.post("/v1/chat/completions", secret, {"model": "m", "messages": HELLO})
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"]["type"] == "server_error"


# -- item 10: headers on quota and concurrency 429s ------------------------------------


def test_quota_refusals_say_the_quota_and_when_it_resets(gateway: Gateway) -> None:
    secret = gateway.key("quota-headers", quota_tokens=100, quota_period_s=DAY_S)
    never = gateway.post("/v1/chat/completions", secret,
                         {"model": "m", "messages": HELLO, "max_tokens": 500})  # fmt: skip
    assert never.status_code == 429 and never.json()["error"]["code"] == "insufficient_quota"
    assert never.headers["x-ratelimit-limit-quota-tokens"] == "100"
    assert never.headers["x-ratelimit-remaining-quota-tokens"] == "100"
    assert never.headers["x-ratelimit-reset-quota-tokens"].endswith("s")
    assert never.headers["x-should-retry"] == "false" and "retry-after" not in never.headers
    used = gateway.post("/v1/chat/completions", secret,
                        {"model": "m", "messages": HELLO, "max_tokens": 50})  # fmt: skip
    assert used.status_code == 200
    deadline = time.monotonic() + 10  # the quota settles to the usage (11) off the request path
    while gateway.store.get("quota-headers").quota_used_at(time.time()) != 11:
        assert time.monotonic() < deadline, "the quota never settled to the usage"
        time.sleep(0.05)
    later = gateway.post("/v1/chat/completions", secret,
                         {"model": "m", "messages": HELLO, "max_tokens": 95})  # fmt: skip
    assert later.status_code == 429
    assert later.headers["x-ratelimit-remaining-quota-tokens"] == "89"
    assert DAY_S - 120 <= int(later.headers["retry-after"]) <= DAY_S
    assert later.headers["x-should-retry"] == "false"  # a day: no client retry can pass


def test_concurrency_refusals_say_the_cap(gateway: Gateway) -> None:
    secret = gateway.key("conc-headers", max_concurrent=1)
    client = gateway.client(secret)
    stream = client.chat.completions.create(model="slow", messages=HELLO, stream=True)
    try:
        next(iter(stream))
        refused = gateway.post("/v1/chat/completions", secret, {"model": "m", "messages": HELLO})
    finally:
        stream.close()
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-limit-concurrency"] == "1"
    assert refused.headers["x-ratelimit-remaining-concurrency"] == "0"
    assert refused.headers["retry-after"] == "1"


# -- item 15: one Authorization header; plain key names --------------------------------


def test_two_authorization_headers_are_refused_and_audited(gateway: Gateway) -> None:
    good, other = gateway.key("two-headers"), gateway.key("two-headers-other")
    headers = [("Authorization", f"Bearer {good}"), ("Authorization", f"Bearer {other}")]
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
        body = {"model": "m", "messages": HELLO} if method == "POST" else None
        answer = httpx.request(method, f"{gateway.url}{path}", json=body, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "multiple_authorization_headers"
    rows = [r for r in key_rows(gateway, None, 1) if r["status"] == 400]
    assert rows and rows[-1]["endpoint"] == "chat/completions"
    assert audit_rows(gateway.db_url, "two-headers", 0, 0) == []  # neither key was used


@pytest.mark.parametrize("name", ["a\nb", "admin\u202etxt", "", "x" * 65, "sp ace", 'q"'])
def test_key_names_outside_the_character_set_are_refused(gateway: Gateway, name: str) -> None:
    with pytest.raises(ValueError, match="a key name is"):
        gateway.store.create(name)


def test_an_older_odd_key_name_shows_as_a_plain_label(gateway: Gateway) -> None:
    """A name made before the rule (written into the database directly here) still works
    and shows in /metrics as plain ASCII, apart from every other key."""
    secret = gateway.key("odd-before")
    odd = "line\nbreak\u202eevil"
    with gateway.store._db.begin() as conn:
        conn.execute(update(api_keys).where(api_keys.c.name == "odd-before").values(name=odd))
    gateway.client(secret).chat.completions.create(model="m", messages=HELLO)
    metrics = gateway.scrape("/metrics").text
    labels = [x for x in metrics.splitlines() if "line_break_evil~" in x]
    assert labels and "\u202e" not in metrics and "line\\nbreak" not in metrics


# -- item 16: every secret the gateway holds is redacted --------------------------------


def test_log_content_rows_hold_no_secret_of_the_gateway(gateway: Gateway) -> None:
    secret = gateway.key("content", log_content=True)
    held = [gateway.backend_key, gateway.metrics_token, f"glued{secret}"]
    text = "echo: keys " + " and ".join(held)
    gateway.client(secret).chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}]
    )
    (row,) = key_rows(gateway, "content", 1)
    stored = f"{row['prompt_text']} {row['completion_text']}"
    assert "keys" in row["prompt_text"] and "keys" in row["completion_text"]
    for value in (gateway.backend_key, gateway.metrics_token, secret):
        assert value not in stored
