"""``inhouse serve --speculative-config``: the same replies as without it, over real HTTP.

One speculative server beside the session's plain one (same model and flags): greedy chat
replies, streamed or not, are identical; /metrics counts drafts with vLLM's names;
/version and the start-up table say what drafts; a bad config exits at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest
from conftest import API_KEY, MAX_MODEL_LEN, RunningServer
from test_metrics import MODEL, scrape, wait_idle

from serving import (
    Served,
    free_port,
    gateway_key,
    gateway_process,
    gateway_toml,
    inhouse_command,
    start_serve,
)

if TYPE_CHECKING:
    import openai

pytestmark = pytest.mark.slow

SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
QUOTED = (
    "Paged attention keeps the KV cache in fixed-size blocks, so memory is not wasted, "
    "and continuous batching admits new requests at every step."
)
MESSAGES = [
    f"Repeat this text exactly: {QUOTED}",
    f"Rewrite in the past tense: {QUOTED}",
    "Copy this code:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
    "What is the capital of France?",
]


@pytest.fixture(scope="module")
def speculative(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Served]]:
    log = tmp_path_factory.mktemp("serve-spec") / "serve.log"
    served = start_serve(
        log, API_KEY, max_model_len=str(MAX_MODEL_LEN), max_num_seqs="32",
        embedding_model=None, speculative_config=json.dumps(SPEC),
    )  # fmt: skip
    try:
        yield RunningServer(served), served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def gateway_client(
    speculative, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    """The official client through ``inhouse gateway`` in front of the speculative server."""
    import openai

    spec_server, _ = speculative
    base = tmp_path_factory.mktemp("gateway-spec")
    port = free_port()
    backend = {"name": "spec-1", "url": spec_server.base_url, "api_key": API_KEY, "model": MODEL}
    config = gateway_toml(
        {"port": port, "database": f"sqlite:///{base / 'gateway.db'}"},
        [{"name": MODEL, "backends": [backend]}],
    )
    config_path = base / "inhouse.toml"
    gateway = gateway_process(config_path, config)
    try:
        gateway.start()
        gateway.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        secret = gateway_key(config_path, "spec-tester")
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=secret, max_retries=0)
    finally:
        gateway.stop()


def _reply(client: openai.OpenAI, message: str, stream: bool) -> str:
    kwargs = {"model": MODEL, "messages": [{"role": "user", "content": message}]}
    kwargs |= {"max_tokens": 48, "temperature": 0}
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message.content or ""
    chunks = client.chat.completions.create(**kwargs, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_greedy_replies_equal_the_plain_servers_streamed_or_not(server, speculative):
    spec_server, _ = speculative
    before = wait_idle(spec_server)
    for message in MESSAGES:
        want = _reply(server.client(), message, stream=False)
        assert _reply(spec_server.client(), message, stream=False) == want
        assert _reply(spec_server.client(), message, stream=True) == want
    after = wait_idle(spec_server)
    drafts = (
        after["inhouse:spec_decode_num_drafts_total"]
        - before["inhouse:spec_decode_num_drafts_total"]
    )
    accepted = after["inhouse:spec_decode_num_accepted_tokens_total"]
    accepted -= before["inhouse:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and accepted > 0
    per_pos = sum(
        after[f"inhouse:spec_decode_num_accepted_tokens_per_pos_total{{position={p}}}"]
        for p in range(4)
    )
    assert per_pos == after["inhouse:spec_decode_num_accepted_tokens_total"]
    assert (
        after["inhouse:spec_decode_num_draft_tokens_total"]
        >= after["inhouse:spec_decode_num_accepted_tokens_total"]
    )


def test_through_the_gateway_the_replies_are_the_plain_servers(server, gateway_client):
    for message in MESSAGES[:2]:
        want = _reply(server.client(), message, stream=False)
        assert _reply(gateway_client, message, stream=False) == want
        assert _reply(gateway_client, message, stream=True) == want


def test_the_plain_server_has_no_spec_decode_metrics(server):
    assert not any(name.startswith("inhouse:spec_decode") for name in scrape(server))


def test_version_and_start_up_table_say_how_it_drafts(server, speculative):
    spec_server, served = speculative
    version = httpx.get(f"{spec_server.base_url}/version").json()
    assert version["speculative_config"]["method"] == "ngram"
    assert version["speculative_config"]["num_speculative_tokens"] == 4
    assert version["speculative_config"]["prompt_lookup_min"] == 1
    assert version["speculative_config"]["adaptive_length"] is True
    assert httpx.get(f"{server.base_url}/version").json()["speculative_config"] is None
    deadline = time.monotonic() + 10  # the table is printed by a thread once loaded
    while "Serving on" not in served.process.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    table = served.process.log.read_text()
    line = r"\n  speculative +ngram, up to 4 tokens, n-grams 1\.\.3\n"
    assert re.search(line, table), table[-600:]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens"),
        ("{nope", "not JSON"),
        ('{"method": "suffix", "suffix_decoding_min_token_prob": 2}', "min_token_prob"),
    ],
)
def test_a_bad_speculative_config_exits_with_its_reason(config, words):
    done = subprocess.run(
        [*inhouse_command(), "serve", "--speculative-config", config],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and words in done.stderr
