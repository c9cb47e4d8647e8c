"""`inhouse up --engine vllm --lora-modules support=ADAPTER`: vLLM's CPU release started with
`--enable-lora --lora-modules`, the gateway declaring the adapter on its backend, and the
official openai client asking for model "support" through the gateway gets the adapter's
answer, not the base's. The adapter is a random one of the bundled model's shapes built here
(`lora_adapters.bundled_adapter`); one replica, its own stack (`vllm_stack`)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from inhouse.launch.vllm import find_vllm, installed_venv
from lora_adapters import bundled_adapter
from vllm_stack import MODEL, client, replicas, running_up_vllm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def up_lora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    if find_vllm() is None:
        pytest.skip(f"vLLM is not installed: `make vllm` installs it into {installed_venv()}")
    home = tmp_path_factory.mktemp("up-vllm-lora")
    adapter = bundled_adapter(home / "support", seed=7)
    extra = ("--lora-modules", f"support={adapter}", "--max-loras", "2")
    with running_up_vllm(home, count=1, extra=extra) as up:
        yield up


def test_the_adapter_answers_through_the_gateway_unlike_the_base(up_lora: dict) -> None:
    text = up_lora["log"].read_text()
    assert "'enable_lora': True" in text and "'max_loras': 2" in text  # vLLM's own args line
    sdk = client(up_lora)
    assert "support" in [card.id for card in sdk.models.list().data]
    greedy = {"messages": ASK, "temperature": 0, "max_tokens": 12}
    base = sdk.chat.completions.create(model=MODEL, **greedy)
    tuned = sdk.chat.completions.create(model="support", **greedy)
    assert tuned.model == "support" or tuned.model.endswith("support")
    assert tuned.choices[0].message.content and tuned.usage.completion_tokens >= 1
    assert tuned.choices[0].message.content != base.choices[0].message.content
    assert (
        tuned.choices[0].message.content
        == sdk.chat.completions.create(model="support", **greedy).choices[0].message.content
    )  # greedy: the adapter's own answer each time


def test_vllm_lists_the_adapter_under_its_base(up_lora: dict) -> None:
    ((_, url),) = replicas(up_lora["log"]).values()
    auth = {"Authorization": f"Bearer {up_lora['replica_key']}"}
    cards = httpx.get(f"{url}/v1/models", headers=auth, timeout=10).json()["data"]
    assert {"id": "support", "parent": MODEL}.items() <= next(
        c for c in cards if c["id"] == "support"
    ).items()
